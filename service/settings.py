"""Every setting of the service, declared once and read once per process from the environment.

Each field of the dataclasses below is one environment variable: its name, what it takes and what it means sit
in the field's metadata, beside its default. :func:`current` reads them all with environs (typed, validated,
every bad value collected) the first time a process asks: gunicorn's config in the master, ``attention-worker``
at its start, ``create_app`` elsewhere. A bad value stops the process with one line naming the variable and
what it takes, never a traceback. docs/configuration.md lists every variable with its default, checked against
:data:`VARIABLES` by a test.

Only the standard library, environs and service.problems here: gunicorn's config imports this module before
anything imports numpy or prometheus_client.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import environs

from service.problems import LimitExceeded

NAME = "attention-service"


@dataclass(frozen=True)
class Kind:
    """What a variable takes: ``takes`` in words (the error line and the docs say it) and ``parse``, the text
    to its value (a ValueError when the text is not one)."""

    takes: str
    parse: Callable[[str], Any]


def _digits(text: str, least: int) -> int:
    """An integer of ASCII digits, at least ``least`` (``int`` would also take "1_000" or other scripts' digits)."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        raise ValueError(text)
    return int(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


def _finite(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("0", "1", "true", "false"):
        raise ValueError(text)
    return value in ("1", "true")


def _port(text: str) -> int:
    value = _digits(text, 1)
    if value > 65535:
        raise ValueError(text)
    return value


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip().lower() not in choices:
            raise ValueError(text)
        return text.strip().lower()

    return parse


def _items(text: str) -> tuple[str, ...]:
    """Comma-separated items, stripped, empty ones dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _keys(text: str) -> tuple[str, ...]:
    keys = _items(text)
    if text.strip() and not keys:  # " , " was meant to lock the API: read as no key, it would open it
        raise ValueError(text)
    return keys


def _above_one(text: str) -> float:
    value = _seconds(text)
    if value <= 1:  # Huey's blocking read waits 1 s for a task: a socket timeout must outlast it
        raise ValueError(text)
    return value


def _queue_url(text: str) -> str | None:
    if text and not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(text)
    return text or None


POSITIVE = Kind("a positive integer", lambda text: _digits(text, 1))
COUNT = Kind("a non-negative integer", lambda text: _digits(text, 0))
SECONDS = Kind("a positive number of seconds", _seconds)
QUEUE_TIMEOUT = Kind("a number of seconds above 1 (Huey's blocking read waits 1 s)", _above_one)
INTERVAL = Kind("a number of seconds (0 or less: at once)", _finite)
FLAG = Kind("1 or 0 (true or false)", _flag)
PORT = Kind("a TCP port, 1 to 65535", _port)
TEXT = Kind("any text", str)
PATH = Kind("a directory path", Path)
LEVEL = Kind("a log level: debug, info, warning, error or critical",
             _choice("debug", "info", "warning", "error", "critical"))
ITEMS = Kind("comma-separated items", _items)
KEYS = Kind("comma-separated keys, at least one (unset: auth off)", _keys)
QUEUE_URL = Kind("a redis://, rediss:// or unix:// URL (empty: SQLite)", _queue_url)


def variable(name: str, default: Any, kind: Kind, meaning: str, *, shown: str | None = None,
             secret: bool = False) -> Any:
    """A dataclass field read from the environment variable ``name``; ``shown``: the default as the docs say it,
    when the value alone does not (None: derived at start-up); ``secret``: left out of the settings' repr."""
    return field(default=default, repr=not secret,
                 metadata={"variable": name, "kind": kind, "meaning": meaning, "shown": shown})


@dataclass(frozen=True)
class Server:
    """gunicorn's settings (service/gunicorn.conf.py) and the job workers started beside it."""

    host: str = variable("HOST", "127.0.0.1", TEXT, "Address gunicorn binds to (the image sets `0.0.0.0`).")
    port: int = variable("PORT", 8000, PORT, "Port gunicorn binds to.")
    workers: int | None = variable(
        "WEB_CONCURRENCY", None, POSITIVE, "Sync web workers (batch job workers not counted).",
        shown="the CPU quota of the process's cgroup, rounded up, at most the cores it may run on; no quota: one "
              "per core")
    timeout: int = variable("GUNICORN_TIMEOUT", 30, POSITIVE,
                            "Seconds a request may run before gunicorn kills its worker.")
    graceful_timeout: int = variable("GUNICORN_GRACEFUL_TIMEOUT", 20, COUNT,
                                     "Seconds in-flight requests (and batch job workers' chunks) get after SIGTERM.")
    max_requests: int = variable("GUNICORN_MAX_REQUESTS", 10000, COUNT, "Requests after which a worker is recycled "
                                 "(`0`: never; small values show as p99 spikes).")
    max_requests_jitter: int = variable("GUNICORN_MAX_REQUESTS_JITTER", 1000, COUNT, "Random extra requests before "
                                        "recycling, so workers do not recycle together.")
    preload: bool = variable("GUNICORN_PRELOAD", True, FLAG, "Load the app (and the models) once in the master and "
                             "fork the workers from it; `0`: each worker loads it.")
    malloc_keep_mb: int = variable("GUNICORN_MALLOC_KEEP_MB", 64, COUNT, "MiB of freed buffers each worker keeps "
                                   "instead of returning them to the kernel; `0`: glibc's defaults.")
    accesslog: str | None = variable("GUNICORN_ACCESSLOG", None, TEXT, "gunicorn's own access log (`-`: stdout); "
                                     "the app writes its own JSON line per request.", shown="unset: off")
    loglevel: str = variable("GUNICORN_LOGLEVEL", "info", LEVEL, "gunicorn's log level.")
    embedded_workers: int = variable("ATTENTION_EMBEDDED_WORKERS", 1, COUNT, "Batch job workers `attention-serve` "
                                     "(`make serve`) starts beside gunicorn; `0`: none (compose and Kubernetes run "
                                     "them apart).")


@dataclass(frozen=True)
class Threads:
    """BLAS threads per process, set to 1 before numpy is imported (service.runtime.process): the processes are
    the parallelism. Read by the BLAS library, validated here."""

    openblas: int = variable("OPENBLAS_NUM_THREADS", 1, POSITIVE,
                             "BLAS threads per process (OpenBLAS): the processes are the parallelism.")
    omp: int = variable("OMP_NUM_THREADS", 1, POSITIVE, "BLAS threads per process (OpenMP).")
    mkl: int = variable("MKL_NUM_THREADS", 1, POSITIVE, "BLAS threads per process (MKL).")


@dataclass(frozen=True)
class Observability:
    """Request log lines and metrics (service.edge.observability, service.runtime)."""

    log_requests: bool = variable("LOG_REQUESTS", True, FLAG, "One JSON log line per request on stdout; `0`: none.")
    log_buffer_bytes: int = variable("LOG_BUFFER_BYTES", 4096, COUNT, "Log lines are written in batches of at most "
                                     "this many bytes (the pipe size: batches never interleave); `0`: every line at "
                                     "once.")
    log_flush_seconds: float = variable("LOG_FLUSH_SECONDS", 1.0, INTERVAL, "A batch of log lines is written at most "
                                        "this long after its first line; `<= 0`: every line at once.")
    metrics_dir: Path | None = variable(
        "PROMETHEUS_MULTIPROC_DIR", None, PATH, "prometheus-client's multiprocess directory; never share one between "
        "instances.", shown="a fresh directory per gunicorn master, `attention-metrics-<pid>` under `$TMPDIR`")


@dataclass(frozen=True)
class Access:
    """Who may call the API, and from which browser origins (service.edge.security)."""

    api_keys: tuple[str, ...] = variable("API_KEYS", (), KEYS, "Comma-separated bearer keys every `/v1` and `/v2` "
                                         "call must bring; one with no key in it stops the start-up.", secret=True,
                                         shown="unset: auth off")
    cors_origins: tuple[str, ...] = variable("CORS_ORIGINS", (), ITEMS, "Comma-separated browser origins allowed to "
                                             "call the API, or `*`.", shown="unset: no CORS headers")


@dataclass(frozen=True)
class Limits:
    """Every limit a request is checked against before any compute, served at GET /v1/limits."""

    max_body_bytes: int = variable("ATTENTION_MAX_BODY_BYTES", 16 * 1024 * 1024, POSITIVE,
                                   "Request body size in bytes (413 above it, also for chunked bodies).")
    max_sequence_length: int = variable("ATTENTION_MAX_SEQUENCE_LENGTH", 1024, POSITIVE,
                                        "Tokens per sequence (n, n_q, n_k, n_positions, size).")
    max_d_model: int = variable("ATTENTION_MAX_D_MODEL", 512, POSITIVE,
                                "Model width and every feature dimension (d_model, d_k, d_v).")
    max_d_ff: int = variable("ATTENTION_MAX_D_FF", 2048, POSITIVE, "Encoder feed-forward width.")
    max_heads: int = variable("ATTENTION_MAX_HEADS", 16, POSITIVE, "Attention heads.")
    max_layers: int = variable("ATTENTION_MAX_LAYERS", 6, POSITIVE, "Encoder layers.")
    max_weight_elements: int = variable(
        "ATTENTION_MAX_WEIGHT_ELEMENTS", 2**21, POSITIVE, "Attention weights per request: B * h * n_q * n_k (times "
        "layers for the encoder and a model's selected layers and heads; with trace times 5, the four n * n stages "
        "and the weights beside them, or 4 when return_weights is false).")
    max_output_elements: int = variable(
        "ATTENTION_MAX_OUTPUT_ELEMENTS", 2**21, POSITIVE, "Numbers along the positions that a request returns, or "
        "computes in one array: the output of scaled dot-product attention B * n_q * d_v (a batch of queries over "
        "one shared key and value asks for far more than its body holds), of self-attention B * n * d_k, of "
        "multi-head attention and the encoder B * n * d_model; with trace also q, k, v (4 arrays in all; the "
        "encoder 1 + 7 per layer); and the encoder's feed-forward layer B * n * d_ff.")
    max_json_depth: int = variable("ATTENTION_MAX_JSON_DEPTH", 32, POSITIVE, "Nesting depth of the JSON body.")
    max_text_chars: int = variable("ATTENTION_MAX_TEXT_CHARS", 10_000, POSITIVE,
                                   "Code points of a model's text (and of text_pair), judged before tokenizing.")
    max_new_tokens: int = variable(
        "ATTENTION_MAX_NEW_TOKENS", 256, POSITIVE, "Tokens one generate request may ask for (max_new_tokens); with "
        "logit_lens each counts as 1 + (n_layers + 1) d_model vocab / (a token's multiply-adds): ~7.5 for SmolLM2.")
    max_batch_new_tokens: int = variable(
        "ATTENTION_MAX_BATCH_NEW_TOKENS", 1024, POSITIVE, "Tokens the generate items of one POST /v1/batch ask for in "
        "all, counted as max_new_tokens counts them (413 above it): so that it answers within GUNICORN_TIMEOUT; and "
        "the most a batch job's chunk of generate or chat lines asks for, so that it ends inside a worker's grace "
        "period.")
    max_flow_tokens: int = variable("ATTENTION_MAX_FLOW_TOKENS", 32, POSITIVE, "Tokens of a text whose attention "
                                    "flow is asked (POST /v1/models/{name}/explain): one maximum flow per pair of "
                                    "tokens, its cost growing about as n^4 (MiniLM: ~0.2 s at 32 tokens, ~3 s at 64).")
    max_knockouts: int = variable("ATTENTION_MAX_KNOCKOUTS", 270, POSITIVE, "Heads one explain request knocks out, "
                                  "one at a time (knock; every head by default: MiniLM has 72, SmolLM2 270).")
    max_rerun_tokens: int = variable(
        "ATTENTION_MAX_RERUN_TOKENS", 3 * 2**16, POSITIVE, "Tokens that explain's knockout and occlusion run through a "
        "layer again, every run together: a knocked head of layer l re-runs layers l to L - 1 for every token, an "
        "occluded token the whole model, a decoder's next-token logits count as d_model vocab / (a token's "
        "multiply-adds in a layer) more (so that it answers within GUNICORN_TIMEOUT: ~50 us a token here, every "
        "MiniLM head up to its 512 tokens, every SmolLM2 head up to 46, a chat with its default system prompt).")
    max_heatmap_cells: int = variable("ATTENTION_MAX_HEATMAP_CELLS", 16384, POSITIVE, "Cells of one SVG heatmap, "
                                      "all panels together (4 heads of 64 x 64 tokens: ~3.5 MB).")
    max_census_texts: int = variable("ATTENTION_MAX_CENSUS_TEXTS", 64, POSITIVE, "Texts of one head census (POST "
                                     "/v1/models/{name}/census); a larger corpus goes through a batch job, its lines' "
                                     "censuses combined by their counts.")
    max_batch_items: int = variable("ATTENTION_MAX_BATCH_ITEMS", 256, POSITIVE,
                                    "Items in one POST /v1/batch (413 above it).")
    max_batch_elements: int = variable(
        "ATTENTION_MAX_BATCH_ELEMENTS", 2**25, POSITIVE, "Budget of one POST /v1/batch: the numbers its items "
        "compute (attention weights B * h * n_q * n_k, times layers, times 5 with trace (4 without "
        "return_weights), plus outputs, plus the encoder's feed-forward hidden layer B * n * d_ff per layer, plus "
        "one per 1024 multiply-adds of projections and feed-forward) plus 3 for each number they return (every "
        "trace array too: the answer takes the memory, ~8 M numbers at most), plus the random weights of each "
        "distinct seeded layer (413 above it).")
    max_job_requests: int = variable("ATTENTION_MAX_JOB_REQUESTS", 50_000, POSITIVE, "Requests (lines) in a batch "
                                     "job's input file (POST /v1/batches: the batch fails).")
    max_file_bytes: int = variable("ATTENTION_MAX_FILE_BYTES", 200 * 1024 * 1024, POSITIVE, "Size of an uploaded "
                                   "file in bytes (POST /v1/files: 413 above it, before it is stored).")
    max_line_bytes: int = variable("ATTENTION_MAX_LINE_BYTES", 1024 * 1024, POSITIVE,
                                   "Bytes of one line of a batch job's input file (the batch fails).")
    file_retention_seconds: int = variable("ATTENTION_FILE_RETENTION_SECONDS", 30 * 24 * 3600, POSITIVE,
                                           "How long an uploaded or output file is kept (its expires_at), unless "
                                           "a batch still needs it.")

    def check(self, name: str, value: int, *, pointer: str | None = None, parameter: str | None = None) -> None:
        """Raise :class:`LimitExceeded` (422) when ``value`` is above the limit ``name``."""
        maximum = getattr(self, name)
        if value > maximum:
            raise LimitExceeded(name, value, maximum, pointer=pointer, parameter=parameter)

    def as_dict(self) -> dict[str, int]:
        """Every limit by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class JobSettings:
    """The batch jobs (service.jobs): where the data lives, which queue, and the timings."""

    data_dir: Path = variable("ATTENTION_DATA_DIR", Path("data"), PATH, "Batch jobs' file bodies and chunk results, "
                              "and the SQLite queue; shared by the API and every worker.",
                              shown="`data` (relative to the working directory; the image sets `/data`)")
    queue_url: str | None = variable("ATTENTION_QUEUE_URL", None, QUEUE_URL, "The batch jobs' queue and records on "
                                     "Redis (`redis://`, `rediss://` or `unix://`), to share them across machines.",
                                     shown="unset: SQLite under `ATTENTION_DATA_DIR`")
    queue_password: str | None = variable(
        "ATTENTION_QUEUE_PASSWORD", None, TEXT, "Password of the Redis at `ATTENTION_QUEUE_URL` (wins over one in the "
        "URL; the Kubernetes manifests read it from a Secret).", shown="unset: the URL's, if any", secret=True)
    queue_timeout_seconds: float = variable(
        "ATTENTION_QUEUE_TIMEOUT_SECONDS", 5.0, QUEUE_TIMEOUT, "Seconds a Redis connection or answer may take before "
        "it fails (tried twice): a silent Redis costs a jobs request at most twice this, then a 503 with "
        "`Retry-After`.")
    served: bool = variable("ATTENTION_BATCH_JOBS", True, FLAG, "Serve the batch jobs (`/v1/files`, `/v1/batches`); "
                            "`0`: they answer 501 saying where batch jobs run (a KServe predictor has no workers).")
    chunk_items: int = variable("ATTENTION_BATCH_CHUNK_ITEMS", 256, POSITIVE,
                                "Lines of a batch job a worker computes in one task.")
    lease_seconds: float = variable("ATTENTION_BATCH_LEASE_SECONDS", 60.0, SECONDS, "How long a chunk's worker may "
                                    "go silent before the chunk is run again elsewhere.")
    reap_seconds: float = variable("ATTENTION_BATCH_REAP_SECONDS", 10.0, SECONDS, "How often lost chunks, "
                                   "cancellations, expiries and expired files are looked for.")
    window_seconds: float = variable("ATTENTION_BATCH_WINDOW_SECONDS", 86400.0, SECONDS,
                                     "What a batch's `completion_window: \"24h\"` means.")
    worker_loglevel: str = variable("ATTENTION_WORKER_LOGLEVEL", "info", LEVEL, "Log level of `attention-worker`.")


@dataclass(frozen=True)
class Settings:
    """The service's settings, by area; ``models`` is ATTENTION_MODELS as written (service.operations.catalogue
    reads it), None when unset."""

    server: Server = field(default_factory=Server)
    threads: Threads = field(default_factory=Threads)
    access: Access = field(default_factory=Access)
    observability: Observability = field(default_factory=Observability)
    models: str | None = variable(
        "ATTENTION_MODELS", None, TEXT, "Trained models served, comma-separated: a packaged model's name, or "
        "`name=path` of a Hugging Face folder or a `.gguf` file; empty: none.",
        shown="unset: the packaged `all-minilm-l6-v2` and `smollm2-135m-instruct`")
    jobs: JobSettings = field(default_factory=JobSettings)
    limits: Limits = field(default_factory=Limits)


AREAS = tuple(f for f in dataclasses.fields(Settings) if "variable" not in f.metadata)
# Every variable by name, in the order of the settings (an area's fields where the area is declared).
VARIABLES: dict[str, dataclasses.Field] = {
    f.metadata["variable"]: f
    for own in dataclasses.fields(Settings)
    for f in (dataclasses.fields(own.default_factory) if own in AREAS else [own])}


class SettingsError(ValueError):
    """Environment variables that hold no valid value: one line names each and what it takes."""


def _read(env: environs.Env, cls: type) -> dict[str, Any]:
    """The fields of dataclass ``cls`` whose variable is set, each parsed by its kind through ``env``."""
    return {f.name: env.attention(f.metadata["variable"], kind=f.metadata["kind"])
            for f in dataclasses.fields(cls)
            if "variable" in f.metadata and f.metadata["variable"] in os.environ}


def from_env() -> Settings:
    """The settings the environment sets (the others keep their defaults); :class:`SettingsError` names every
    variable that holds no valid value."""
    env = environs.Env(eager=False)

    @env.parser_for("attention")
    def parse(value: str, kind: Kind) -> Any:
        try:
            return kind.parse(value)
        except ValueError:
            raise environs.EnvError(kind.takes) from None

    areas = {area.name: area.default_factory(**_read(env, area.default_factory)) for area in AREAS}
    own = _read(env, Settings)
    try:
        env.seal()
    except environs.EnvValidationError as error:
        raise SettingsError("; ".join(f"{name} must be {messages[0]}, got {os.environ.get(name, '')[:80]!r}"
                                      for name, messages in sorted(error.error_messages.items()))) from None
    return Settings(**areas, **own)


@contextmanager
def refusing() -> Iterator[None]:
    """A :class:`SettingsError` raised inside ends the process with its one line on stderr, naming the variable
    at fault and what it takes, and exit status 2: start-up stops without a traceback."""
    try:
        yield
    except SettingsError as error:
        print(f"{NAME}: {error}", file=sys.stderr)
        raise SystemExit(2) from None


@functools.cache
def current() -> Settings:
    """This process's settings, read from the environment the first time it asks (a bad value ends the
    process: :func:`refusing`)."""
    with refusing():
        return from_env()


def shown_default(f: dataclasses.Field) -> str:
    """A variable's default as the docs show it."""
    if f.metadata["shown"] is not None:
        return f.metadata["shown"]
    default = f.default
    if isinstance(default, bool):
        return "`1`" if default else "`0`"
    return f"`{default:g}`" if isinstance(default, float) else f"`{default}`"


def table() -> str:
    """The Markdown table of every variable, its default and its meaning (docs/configuration.md holds it)."""
    rows = [f"| `{name}` | {shown_default(f)} | {f.metadata['meaning']} |" for name, f in VARIABLES.items()]
    return "\n".join(["| Variable | Default | Meaning |", "| --- | --- | --- |", *rows]) + "\n"


if __name__ == "__main__":
    print(table(), end="")

