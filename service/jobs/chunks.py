"""A chunk of a batch computed by a worker: its lines read back by byte range, each body validated and sized by
its endpoint's rules, all computed together as /v1/batch computes (service.operations.answers), in runs within
``max_batch_elements``; the answers written as output lines, the refused items as error lines, both files renamed
into place at once, then the chunk's counts recorded once.
"""

from __future__ import annotations

from typing import Any

import orjson

from service.jobs import finalize, keys, leases, records
from service.jobs.context import Jobs
from service.jobs.endpoints import CHAT, CHAT_URL, endpoints
from service.operations import answers, chat
from service.operations.jsontext import check_depth, dumps
from service.operations.registry import BATCH_OPERATIONS
from service.problems import Problem, invalid, problem_members


def run(jobs: Jobs, batch_id: str, index: int) -> None:
    """Compute chunk ``index`` of ``batch_id`` unless it is done, or the batch is stopping (cancelled, expired,
    being finished: the reaper gives its items their error lines)."""
    batch = records.read(jobs, batch_id, chunk=index)
    if batch.record is None or batch.validated is None or batch.counts[index] is not None:
        return
    if batch.cancel is not None or batch.finalizing is not None or batch.expiring:
        jobs.store.delete([keys.lease(batch_id, str(index))])  # not run: nothing to reap
        return
    with leases.held(jobs, batch_id, str(index)):
        numbered = jobs.bodies.lines(batch.record["input_file_id"], batch.chunks[index])
        out, err = _answer(jobs, batch_id, batch.record["endpoint"], numbered)
        jobs.bodies.write(jobs.bodies.chunk(batch_id, index, "out"), out)
        jobs.bodies.write(jobs.bodies.chunk(batch_id, index, "err"), err)
        jobs.store.claim(keys.chunk(batch_id, index), {"completed": len(out), "failed": len(err)})
    finalize.if_complete(jobs, batch_id)


def _answer(jobs: Jobs, batch_id: str, endpoint: str, numbered: list[tuple[int, bytes]]) -> tuple[list[bytes],
                                                                                                  list[bytes]]:
    """The output lines and the error lines of the requests ``numbered`` (line number, line)."""
    op, path = endpoints()[endpoint]
    requests = [orjson.loads(line) for _, line in numbered]  # each parsed once already, when validated
    outcomes: list[Any] = [_refused(jobs, op, line, request.get("body"), path)
                           for (_, line), request in zip(numbered, requests, strict=True)]
    bodies = [request.get("body") for request in requests]
    chats: list[chat.BatchItem | None] = [None] * len(requests)
    if op == CHAT:  # OpenAI's chat lines: each translated to a generate item, its answer translated back
        op = "generate"
        for i, body in enumerate(bodies):
            if outcomes[i] is None:
                item = chat.batch_item(body)
                outcomes[i], chats[i], bodies[i] = (item, None, None) if isinstance(item, Problem) else (
                    None, item, item.body)
    open_items = [i for i, outcome in enumerate(outcomes) if outcome is None]
    refused, sized = answers.size([(op, _with_path(bodies[i], path)) for i in open_items], jobs.limits, _root)
    for position, problem in enumerate(refused):
        outcomes[open_items[position]] = problem
    for run_ in answers.budgets(sized, jobs.limits.max_batch_elements):
        for position, answer in answers.compute(run_, _root):
            outcomes[open_items[position]] = answer
    out, err = [], []
    for (number, _), request, outcome, item in zip(numbered, requests, outcomes, chats, strict=True):
        line_id, request_id = keys.request_ids(batch_id, number)
        if isinstance(outcome, Problem):
            members = chat.problem(chat.renamed_problem(outcome, item.renamed) if item else outcome) if (
                endpoint == CHAT_URL) else problem_members(outcome)
            body = {**members, "request_id": request_id}
            response = {"status_code": body["status"], "request_id": request_id, "body": body}
        else:
            answer = chat.completion(item.model, outcome, item.logprobs) if item else outcome
            response = {"status_code": 200, "request_id": request_id, "body": answer}
        line = {"id": line_id, "custom_id": request["custom_id"], "response": response,
                "error": None}
        (err if isinstance(outcome, Problem) else out).append(dumps(line) + b"\n")
    return out, err


def _root(index: int) -> tuple[str | int, ...]:
    return ()  # pointers relative to the line's body, as its endpoint would answer them


def _refused(jobs: Jobs, op: str, line: bytes, body: Any, path: dict[str, Any]) -> Problem | None:
    """What the endpoint refuses before the batch item's schema could say it: a body nested past max_json_depth
    (the body's own nesting, not the line's), or one naming a path parameter, which the url gives (the endpoint's
    own schema has no such field: its problem is the one that schema gives). Any other body, an object or not, is
    the item schema's to judge, with the endpoint's problem."""
    if line.count(b"[") + line.count(b"{") > jobs.limits.max_json_depth:  # else the body cannot be that deep
        try:
            check_depth(orjson.dumps(body), jobs.limits)
        except Problem as problem:
            return problem
    if isinstance(body, dict) and any(name in body for name in path):
        return invalid(BATCH_OPERATIONS[op].request().validate(body))
    return None


def _with_path(body: Any, path: dict[str, Any]) -> Any:
    """The item's body with the url's parameters, as /v1/batch takes it (one that is no object: as it is)."""
    return {**body, **path} if isinstance(body, dict) else body
