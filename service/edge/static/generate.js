// The playground's generate mode: a decoder continues a prompt (or answers a chat message) token by token, the
// tokens shown as the server streams them (server-sent events read from fetch(): EventSource cannot POST). Any
// token clicked shows its attention row in every layer and head, its candidates and its logit lens.
// Loaded after playground.js, whose helpers it uses ($, element, api, problemError, failedAnswer, matrixTable,
// thumbnail, offerModels): a mode of its own file, so that the other modes change without touching it.
"use strict";

// What the last run gave: the request, its decoder, each step as it came, the prompt's tokens (at the done event)
// and its attention (asked for once, when a prompt token is first clicked).
let generated = null;
let stopGeneration = null;  // aborts the stream under way

// A token's text with its whitespace made visible: " the" and "\n" are tokens of their own.
const visible = (token) => token.replaceAll(" ", "␣").replaceAll("\n", "↵").replaceAll("\t", "⇥");

function generateStatus(text) {
  $("#gen-status").textContent = text;
}

function showGenerateError(failure, status) {
  $("#gen-error").textContent = failure.message;
  $("#gen-error").hidden = false;
  generateStatus(status);
}

// The request as the form says: every layer's rows for each step (all heads by default), streamed.
function readGeneration(model) {
  const number = (id) => Number($(id).value);
  const text = $("#gen-text").value;
  const body = $("#gen-as-chat").checked ? {messages: [{role: "user", content: text}]} : {prompt: text};
  Object.assign(body, {max_new_tokens: number("#gen-max-new-tokens"), temperature: number("#gen-temperature"),
    top_k: number("#gen-top-k"), top_p: number("#gen-top-p"), logit_lens: $("#gen-lens").checked,
    layers: Array.from({length: model.n_layers}, (_, layer) => layer), stream: true});
  const seed = $("#gen-seed").value.trim();
  if (seed !== "") body.seed = exactInteger(seed);
  return body;
}

// Seeds are 64-bit: past 2^53 a JavaScript number changes their last digits, so they travel as their digits
// (JSON.rawJSON writes them as they are; JSON.parse's context.source reads them back, as a string).
function exactInteger(digits) {
  if (!/^\d+$/.test(digits)) throw new Error(`/seed: a whole number of 0 or more, not ${JSON.stringify(digits)}.`);
  return JSON.rawJSON ? JSON.rawJSON(digits) : Number(digits);
}
const seedAsDigits = (key, value, context) => (key === "seed" && context?.source ? context.source : value);

// Server-sent events from a streamed answer, as {event, data} (data parsed), each as soon as its blank line came.
async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const fields = Object.fromEntries(buffer.slice(0, end).split("\n").map((line) => {
        const colon = line.indexOf(":");
        return [line.slice(0, colon), line.slice(colon + 1).trimStart()];
      }));
      buffer = buffer.slice(end + 2);
      yield {event: fields.event || "message", data: JSON.parse(fields.data, seedAsDigits)};
    }
  }
}

// A token as a button; ``kind`` is "prompt" or "generated", ``index`` its place among them.
function tokenButton(text, kind, index, title) {
  const button = element("button", {type: "button", class: `token ${kind}`, "data-kind": kind, "data-index": index,
    title, "aria-pressed": "false"}, visible(text));
  button.addEventListener("click", () => chooseToken(kind, index).catch((failure) =>
    showGenerateError(failure, "Could not show this token.")));
  return button;
}

function addStep(step) {
  generated.steps.push(step);
  $("#gen-new-tokens").append(tokenButton(step.token, "generated", step.index,
    `generated token ${step.index}, id ${step.id}, p = ${Math.exp(step.logprob).toFixed(3)}`));
  $("#gen-text-out").textContent = generated.steps.map((each) => each.text).join("");
  generateStatus(`Generating… ${generated.steps.length} tokens so far.`);
}

function showPromptTokens(tokens, ids) {
  generated.promptTokens = tokens;
  $("#gen-prompt-tokens").replaceChildren(...tokens.map((token, i) =>
    tokenButton(token, "prompt", i, `prompt token ${i}, id ${ids[i]}`)));
}

// The done event's summary: the final text and how it ended (the prompt's tokens came first, in their own event).
function finish(summary) {
  $("#gen-text-out").textContent = summary.text;  // without a stop string, which the steps' texts may hold
  generateStatus(`Done: ${summary.usage.completion_tokens} new tokens after ${summary.usage.prompt_tokens} ` +
    `prompt tokens; finish: ${summary.finish_reason}; seed ${summary.seed}.`);
  return true;
}

function clearGeneration() {
  $("#gen-results").hidden = true;
  $("#gen-token").hidden = true;
  for (const id of ["#gen-prompt-tokens", "#gen-new-tokens", "#gen-view", "#gen-candidates", "#gen-lens-out"]) {
    $(id).replaceChildren();
  }
  $("#gen-text-out").textContent = "";
}

// One streamed generation: a refused request (4xx problem) or an error event is shown as the API says it.
async function runGenerate(event) {
  event.preventDefault();
  const model = generateModel();
  const aborter = new AbortController();
  stopGeneration = () => aborter.abort();
  $("#gen-error").hidden = true;
  $("#run-generate").disabled = true;
  $("#stop-generate").disabled = false;
  clearGeneration();
  generated = {model, body: null, steps: [], promptTokens: null, promptAttention: null};
  generateStatus("Sending the prompt…");
  try {
    const body = generated.body = readGeneration(model);
    const response = await fetch(`v1/models/${encodeURIComponent(model.name)}/generate`, {method: "POST",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(body), signal: aborter.signal});
    if (!response.ok) throw await failedAnswer(response);
    $("#gen-results").hidden = false;
    let done = false;
    for await (const {event: name, data} of serverEvents(response)) {
      if (name === "prompt") showPromptTokens(data.tokens, data.token_ids);
      else if (name === "token") addStep(data);
      else if (name === "done") done = finish(data);
      else if (name === "error") throw problemError(data, "The generation failed midway.");
    }
    if (!done) throw new Error("The stream ended before its done event (the connection was cut).");
  } catch (failure) {
    if (failure.name === "AbortError") generateStatus(`Stopped after ${generated.steps.length} tokens.`);
    else if (generated.steps.length) showGenerateError(failure, "The generation stopped midway (see below).");
    else showGenerateError(failure, generated.body ? "The API refused the request." : "Nothing sent (see below).");
  } finally {
    $("#run-generate").disabled = false;
    $("#stop-generate").disabled = true;
  }
}

// The prompt's attention, asked for once: a prompt token's row is its row of the (h, n, n) weights of the same
// text through POST .../attention (the generate stream returns only the new tokens' rows).
async function promptAttention() {
  if (!generated.promptAttention) {
    const {prompt, messages} = generated.body;
    generated.promptAttention = postJson(`v1/models/${encodeURIComponent(generated.model.name)}/attention`,
      prompt === undefined ? {messages} : {text: prompt});
  }
  return generated.promptAttention;
}

// A token's rows: [{layer, heads, weights (h, n_keys)}], its keys the tokens up to it, itself last.
async function tokenRows(kind, index) {
  if (kind === "generated") return generated.steps[index].attention;
  const answer = await promptAttention();
  return answer.layers.map(({layer, heads, weights}) => ({layer, heads,
    weights: weights.map((head) => head[index].slice(0, index + 1))}));  // the causal mask hid the rest
}

// Every token so far up to a key position: the prompt's, then the generated ones.
function keyLabels(count) {
  return [...generated.promptTokens ?? [], ...generated.steps.map((step) => step.token)].slice(0, count).map(visible);
}

async function chooseToken(kind, index) {
  for (const button of document.querySelectorAll("#gen-results button.token")) {
    const chosen = button.dataset.kind === kind && Number(button.dataset.index) === index;
    button.setAttribute("aria-pressed", String(chosen));
  }
  const step = kind === "generated" ? generated.steps[index] : null;
  const label = kind === "generated" ? step.token : generated.promptTokens[index];
  $("#gen-token-heading").textContent = `${kind === "generated" ? "Generated" : "Prompt"} token ${index}: ` +
    `“${visible(label)}”`;
  showCandidates(step);
  showLens(step);
  $("#gen-token").hidden = false;
  $("#gen-view").replaceChildren(element("p", {class: "help"}, "Asking for its attention…"));
  try {
    showTokenView(await tokenRows(kind, index));
  } catch (failure) {  // a prompt's (h, n, n) weights in all 30 layers pass max_weight_elements past ~88 tokens
    const what = kind === "prompt" ? "The prompt's attention (POST …/attention, every layer and head) was " +
      "refused:\n" : "";
    $("#gen-view").replaceChildren(element("p", {class: "error", role: "alert"}, what + failure.message));
  }
}

// The model view of one token: layers down, heads across, a strip per head (its row over the keys, drawn as the
// real mode's thumbnails are). Heads that share a key/value head (grouped-query attention) are framed together.
function showTokenView(rows) {
  const heads = rows[0].heads;
  const perGroup = heads.length / (generated.model.n_kv_heads || heads.length);
  const labels = keyLabels(rows[0].weights[0].length);
  const view = $("#gen-view");
  view.style.setProperty("--heads", heads.length);
  const groups = Array.from({length: heads.length / perGroup}, (_, g) => element("span",
    {class: "view-label kv-group", "data-kv": g, style: `grid-column: span ${perGroup}`},
    `key/value head ${g}: heads ${g * perGroup}–${(g + 1) * perGroup - 1}`));
  const header = [element("span", {class: "view-label corner"}, ""), ...groups,
    element("span", {class: "view-label corner"}, "layer ↓ head →"),
    ...heads.map((head) => element("span", {class: kvClass(head, perGroup, "view-label")}, String(head)))];
  const strips = rows.flatMap(({layer, weights}) => [element("span", {class: "view-label"}, String(layer)),
    ...weights.map((row, k) => strip(layer, heads[k], row, labels, perGroup))]);
  view.replaceChildren(...header, ...strips);
}

// A head's class: the first of its key/value group starts a new frame.
const kvClass = (head, perGroup, base) => `${base}${head % perGroup === 0 ? " kv-first" : ""}`;

// One head's row as a strip of pixels, its exact weights in data-weights, the key it weighs most in its title.
function strip(layer, head, row, labels, perGroup) {
  const top = row.indexOf(Math.max(...row));
  const group = Math.floor(head / perGroup);
  return element("span", {class: kvClass(head, perGroup, "strip"), "data-layer": layer, "data-head": head,
    "data-kv": group, "data-weights": JSON.stringify(row),
    title: `layer ${layer}, head ${head} (key/value head ${group}): most on “${labels[top] ?? top}” ` +
      `(key ${top}), ${row[top].toFixed(3)}`}, thumbnail([row]));
}

// A step's candidates: the model's probability (exp of its logprob, before temperature, top-k and top-p) and the
// probability it was drawn with after them, as bars; the drawn token marked.
function showCandidates(step) {
  if (!step) {
    $("#gen-candidates").replaceChildren(element("p", {class: "help"},
      "A prompt token was given, not drawn: it has no candidates."));
    return;
  }
  const bar = (kind, value) => element("span", {class: `bar ${kind}`, style: `width: ${(100 * value).toFixed(1)}%`});
  const rows = step.top.map((candidate) => {
    const p = Math.exp(candidate.logprob);
    return element("li", {class: candidate.id === step.id ? "chosen" : "", "data-id": candidate.id,
      "data-probability": p, "data-drawn": candidate.drawn},
    element("code", {}, visible(candidate.token)),
    element("span", {class: "bars"}, bar("model", p), bar("drawn", candidate.drawn)),
    element("span", {class: "numbers"}, `${p.toFixed(3)} → ${candidate.drawn.toFixed(3)}`));
  });
  $("#gen-candidates").replaceChildren(element("p", {class: "help"}, `The ${step.top.length} likeliest tokens: ` +
    `the model's probability (upper bar), then the one it was drawn with after temperature, top-k and top-p ` +
    `(lower bar; kept: ${step.kept} of the vocabulary). The drawn token is marked.`), element("ol", {class: "candidates"},
    ...rows));
}

// The logit lens: after each layer, the 5 tokens its hidden state would predict (the final norm and the output
// head applied), with their probabilities.
function showLens(step) {
  if (!step?.logit_lens) {
    $("#gen-lens-out").replaceChildren();
    return;
  }
  const lens = step.logit_lens;
  const cells = lens.map(({top}) => top.map(({token, logprob}) => `${visible(token)} ${Math.exp(logprob)
    .toFixed(3)}`));
  $("#gen-lens-out").replaceChildren(element("h3", {}, "The logit lens"), matrixTable(cells, {
    rows: lens.map(({after_layers: depth}) => String(depth)), cols: lens[0].top.map((_, rank) => String(rank + 1)),
    corner: "after layers ↓ rank →", caption: "What the hidden state after each layer would predict",
    name: "lens"}));
}

// The decoders the server serves (an encoder cannot generate), asked for on the first visit to this mode.
let decoders = [];
const generateModel = () => decoders.find((model) => model.name === $("#gen-model").value);

function describeDecoder(model) {
  $("#gen-model-info").textContent = `${model.architecture}: ${model.n_layers} layers × ${model.n_heads} heads ` +
    `sharing ${model.n_kv_heads ?? model.n_heads} key/value heads, d_model ${model.d_model}.`;
}

async function loadDecoders() {
  const [{models}, limits] = await Promise.all([api("v1/models"), api("v1/limits")]);
  decoders = models.filter((model) => model.causal);
  $("#gen-max-new-tokens").max = limits.max_new_tokens;
  offerModels(decoders, {select: "#gen-model", run: "#run-generate", info: "#gen-model-info",
    describe: describeDecoder, none: "This server serves no decoder (see its ATTENTION_MODELS setting): the " +
      "generate mode has nothing to run."});
}

function chooseGenerateMode() {
  const shown = $("#mode-generate").checked;
  $("#generate-mode").hidden = !shown;
  const select = $("#gen-model");
  if (!shown || select.dataset.loaded) return;
  select.dataset.loaded = "yes";
  loadDecoders().catch((failure) => showGenerateError(failure, "Could not load the decoders."));
}

document.addEventListener("DOMContentLoaded", () => {
  $("#generate-form").addEventListener("submit", runGenerate);
  $("#stop-generate").addEventListener("click", () => stopGeneration?.());
  for (const radio of document.querySelectorAll("input[name=mode]")) {
    radio.addEventListener("change", chooseGenerateMode);
  }
  if (location.hash === "#generate-mode") {  // a link straight to this mode
    $("#mode-generate").checked = true;
    chooseMode();
  }
  chooseGenerateMode();
});
