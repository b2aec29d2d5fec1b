// The attention playground: plain DOM code over the public HTTP API (no framework, no build step).
// Every number shown comes from the API; relative URLs so the page works behind a path prefix.
"use strict";

const STEPS = [
  ["scores", "Raw scores Q·Kᵀ", "How well each query matches each key: the dot product of their vectors."],
  ["scaled_scores", "Scaled", "Divided by √d_k so that wide heads do not push the softmax to a hard argmax."],
  ["masked_scores", "Masked", "Positions a token may not see are set to −∞ (shown as “masked”)."],
  ["weights", "Softmax weights", "exp of each score over the row's sum: every row now sums to 1."],
];

const $ = (selector) => document.querySelector(selector);

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

// Scalars keep integers whole (d_model 8); table cells always show 3 decimals so columns line up.
function formatNumber(value, fixed = false) {
  if (value === null) return "masked";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) && !fixed ? String(value) : value.toFixed(3);
}

// One line of a problem's errors: its pointer, then its detail. The engine's details start with the argument's
// name ("n_heads: d_model=8 must be ..."), which the pointer (/n_heads) already says: it is dropped here.
function problemLine({pointer, parameter, detail}) {
  const where = pointer || parameter;
  const field = where.split("/").filter((part) => part && !/^\d+$/.test(part)).pop();
  return `${where}: ${field && detail.startsWith(`${field}: `) ? detail.slice(field.length + 2) : detail}`;
}

// fetch JSON or SVG; a problem+json answer becomes an Error carrying the API's explanation.
async function api(path, options = {}) {
  const response = await fetch(path, options);
  const type = response.headers.get("Content-Type") || "";
  if (!response.ok) {
    const problem = type.includes("json") ? await response.json() : {detail: await response.text()};
    const where = (problem.errors || []).map(problemLine);
    throw new Error(where.length ? where.join("\n") : problem.detail || response.statusText);
  }
  return type.includes("svg") ? response.text() : response.json();
}

const postJson = (path, body) => api(path, {
  method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
});

// Parse an SVG answer into live DOM (cells keep data-value and <title>), with ids made unique per figure.
function svgNode(text, prefix) {
  const svg = document.importNode(new DOMParser().parseFromString(text, "image/svg+xml").documentElement, true);
  for (const node of svg.querySelectorAll("[id]")) {
    const old = node.id;
    node.id = `${prefix}-${old}`;
    for (const user of svg.querySelectorAll(`[fill="url(#${old})"]`)) user.setAttribute("fill", `url(#${node.id})`);
  }
  return svg;
}

// A matrix as a table: rows and columns labelled (tokens, positions, ...), the corner cell naming both axes
// ("query ↓ key →"). ``format(value, j)`` writes the value of column j; a Node cell is put in as it is.
function matrixTable(matrix, {rows, cols, corner, caption, format = (value) => formatNumber(value, true)}) {
  const head = element("tr", {}, element("th", {scope: "col", class: "axes"}, corner),
    ...cols.map((label) => element("th", {scope: "col"}, label)));
  const body = matrix.map((row, i) => element("tr", {}, element("th", {scope: "row"}, rows[i]),
    ...row.map((value, j) => value instanceof Node ? element("td", {class: "text"}, value) :
      element("td", {class: value === null || value === false ? "masked" : ""}, format(value, j)))));
  const table = element("table", {}, element("caption", {}, caption), element("thead", {}, head),
    element("tbody", {}, ...body));
  return element("div", {class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption}, table);
}

const positions = (count) => Array.from({length: count}, (_, i) => String(i));

function readRequest() {
  const body = {
    n_heads: Number($("#heads").value),
    seed: Number($("#seed").value),
    causal: $("#causal").checked,
    positional_encoding: $("#positional").checked,
    trace: true,
  };
  if ($("#source-tokens").checked) {
    body.tokens = $("#tokens").value.trim().split(/\s+/).filter(Boolean);
    body.d_model = Number($("#d-model").value);
    return {body, labels: body.tokens};
  }
  try {
    body.embeddings = JSON.parse($("#embeddings").value);
  } catch (error) {
    throw new Error(`The embeddings are not valid JSON: ${error.message}`);
  }
  const count = Array.isArray(body.embeddings) ? body.embeddings.length : 0;
  return {body, labels: Array.from({length: count}, (_, i) => String(i))};
}

function showTrace(answer, labels, head) {
  const trace = $("#trace");
  trace.replaceChildren();
  for (const [key, title, explanation] of STEPS) {
    trace.append(element("li", {}, element("h3", {}, title), element("p", {class: "help"}, explanation),
      matrixTable(answer.trace[key][head], {rows: labels, cols: labels, corner: "query ↓ key →",
        caption: `${title}, head ${head}`})));
  }
  const width = answer.output[0].length;
  trace.append(element("li", {}, element("h3", {}, "Output"),
    element("p", {class: "help"}, "Each head's weights average its value vectors; the heads are concatenated " +
      "and mixed by W_o into one vector per token, as wide as the input (d_model)."),
    matrixTable(answer.output, {rows: labels, cols: positions(width), corner: "token ↓ dimension →",
      caption: "Output, all heads"})));
}

async function run(event) {
  event.preventDefault();
  const error = $("#error");
  error.hidden = true;
  $("#run").disabled = true;
  $("#status").textContent = "Running…";
  try {
    const {body, labels} = readRequest();
    const answer = await postJson("v1/multi-head-attention", body);
    const heads = answer.weights;
    const pictures = await Promise.all(heads.map((weights, h) => postJson("v1/heatmap", {
      weights, row_labels: labels, col_labels: labels, title: `Head ${h}`,
    })));
    $("#heatmaps").replaceChildren(...pictures.map((svg, h) => element("figure", {class: "heatmap", "data-head": h},
      svgNode(svg, `head${h}`),
      element("figcaption", {}, `Head ${h} of ${heads.length}: rows are queries, columns keys`))));
    const select = $("#trace-head");
    select.replaceChildren(...heads.map((_, h) => element("option", {value: h}, `head ${h}`)));
    select.onchange = () => showTrace(answer, labels, Number(select.value));
    showTrace(answer, labels, 0);
    $("#results").hidden = false;
    $("#status").textContent = `Done: ${heads.length} heads over ${labels.length} tokens.`;
  } catch (failure) {
    // Results left on screen would read as the answer to the request that just failed.
    $("#results").hidden = true;
    $("#heatmaps").replaceChildren();
    $("#trace").replaceChildren();
    error.textContent = failure.message;
    error.hidden = false;
    $("#status").textContent = "Nothing computed (see below); the earlier results are cleared.";
  } finally {
    $("#run").disabled = false;
  }
}

// Each demo's arrays, laid out: their row labels, column labels and the axes the corner names. A vector is one row.
const QUERY_BY_KEY = (result) => [[result.query_token], result.tokens, "query ↓ key →"];
const DEMO_AXES = {
  lookup: {scores: QUERY_BY_KEY, scaled_scores: QUERY_BY_KEY,
    output: (result) => [[result.query_token], result.dimensions, "query ↓ dimension →"]},
  "positional-encoding": {
    sentences: (result) => [result.sentences.map((_, i) => `sentence ${i + 1}`),
      positions(result.sentences[0].length), "sentence ↓ position →"],
    positional_encoding: (result) => [positions(result.positional_encoding.length),
      positions(result.positional_encoding[0].length), "position ↓ dimension →"]},
  "causal-mask": {mask: (result) => [result.tokens, result.tokens, "query ↓ key →"]},
  "multi-head": {output: (result) => [result.tokens, positions(result.d_model), "token ↓ dimension →"]},
};

// A weight this close to its row's largest is not told apart from it: with 0.335 against 0.331 no key "wins".
const TIE = 0.05;

// The key that one query row weighs most, or the keys that tie for it, as a table cell.
function strongestLink(weights, tokens) {
  const seen = weights.map((weight, k) => [weight, tokens[k]]).filter(([weight]) => weight > 0)
    .sort(([a], [b]) => b - a);
  if (seen.length === 1) return element("span", {class: "tie"}, `${seen[0][1]} (its only key)`);
  const close = seen.filter(([weight]) => seen[0][0] - weight < TIE);
  if (close.length === seen.length) return element("span", {class: "tie"}, `even: all ${seen.length} within ${TIE}`);
  const named = close.map(([weight, token]) => `${token} ${weight.toFixed(3)}`);
  if (close.length === 1) return element("strong", {}, named[0]);
  return element("span", {class: "tie"}, `tie: ${named.join(" ≈ ")}`);
}

// The multi-head demo's strongest links, from its weights: the key each query weighs most, per head.
function strongestLinks(result) {
  const rows = result.tokens.map((_, i) => result.weights.map((head) => strongestLink(head[i], result.tokens)));
  return element("div", {}, element("p", {class: "help"}, `Rows are the querying tokens, columns the heads; a ` +
    `cell names the key the query weighs most, and only when it leads the next by ${TIE} or more: closer ` +
    "weights are a tie, not a finding (and these weights are random)."),
  matrixTable(rows, {rows: result.tokens, cols: result.weights.map((_, h) => `head ${h}`),
    corner: "query ↓ head →", caption: "strongest links"}));
}

// A list of records (the scaling demo's rows) as a table: one row a record, headed by its first field; a field
// whose values are all integers prints them whole (d_k 512, not 512.000).
function recordTable(records, caption) {
  const [first, ...keys] = Object.keys(records[0]);
  const whole = keys.map((key) => records.every((record) => Number.isInteger(record[key])));
  return matrixTable(records.map((record) => keys.map((key) => record[key])), {
    rows: records.map((record) => formatNumber(record[first])), cols: keys, corner: first, caption,
    format: (value, j) => formatNumber(value, !whole[j])});
}

// A demo's member: a labelled table where its axes are known, else a record table, a line of text or a value.
function describe(result, demo, key) {
  const value = result[key];
  if (demo === "multi-head" && key === "strongest_links") return strongestLinks(result);
  const axes = DEMO_AXES[demo]?.[key];
  if (axes) {
    const [rows, cols, corner] = axes(result);
    return matrixTable(Array.isArray(value[0]) ? value : [value], {rows, cols, corner, caption: key});
  }
  if (Array.isArray(value) && value.length && typeof value[0] === "object") return recordTable(value, key);
  if (Array.isArray(value) && value.some(Array.isArray)) return element("code", {}, JSON.stringify(value));
  if (Array.isArray(value)) return element("span", {}, value.map((item) => formatNumber(item)).join(", "));
  return element("span", {}, formatNumber(value));
}

async function openDemo(details, name) {
  if (details.dataset.loaded) return;
  details.dataset.loaded = "yes";
  const body = details.querySelector(".demo-body");
  try {
    const demo = await api(`v1/demos/${encodeURIComponent(name)}`);
    const drawn = "weights" in demo.result;  // the demos that show weights have a heatmap
    if (drawn) {
      const svg = await api(`v1/demos/${encodeURIComponent(name)}/heatmap`);
      body.append(element("figure", {class: "heatmap"}, svgNode(svg, `demo-${name}`)));
    }
    const list = element("dl", {class: "demo-result"});
    for (const key of Object.keys(demo.result)) {
      if (drawn && key === "weights") continue;  // hover the heatmap's cells for the exact values
      list.append(element("dt", {}, key.replaceAll("_", " ")), element("dd", {"data-key": key},
        describe(demo.result, name, key)));
    }
    body.append(list);
  } catch (failure) {
    body.append(element("p", {class: "error", role: "alert"}, failure.message));
  }
}

async function loadDemos() {
  const {demos} = await api("v1/demos");
  $("#demo-list").replaceChildren(...demos.map((demo, i) => {
    const details = element("details", {class: "demo", id: `demo-${demo.name}`},
      element("summary", {}, `${i + 1}. ${demo.title}`), element("p", {}, demo.summary),
      element("div", {class: "demo-body"}));
    details.addEventListener("toggle", () => details.open && openDemo(details, demo.name));
    return details;
  }));
}

async function loadVocabulary() {
  const vocabulary = await api("v1/vocabulary");
  $("#dimensions").textContent = vocabulary.dimensions.join(", ");
  $("#vocabulary").replaceChildren(...Object.keys(vocabulary.tokens).map((word) => {
    const button = element("button", {type: "button", class: "word", "aria-label": `Add ${word}`}, `+ ${word}`);
    button.addEventListener("click", () => {
      const tokens = $("#tokens");
      tokens.value = `${tokens.value.trim()} ${word}`.trim();
    });
    return button;
  }));
}

// The real model: one request computes every layer and head; choosing a head only redraws.

// The server heatmaps' palette (viridis, 256 levels, exact zeros grey: service/operations/heatmap.py), so that
// the model view's small pictures and the enlarged one read alike.
const VIRIDIS = ["440154", "482878", "3e4989", "31688e", "26828e", "1f9e89", "35b779", "6ece58", "fde725"]
  .map((hex) => [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16)));
const LEVELS = Array.from({length: 256}, (_, level) => {
  const position = level / 255 * (VIRIDIS.length - 1);
  const low = Math.min(Math.floor(position), VIRIDIS.length - 2);
  return VIRIDIS[low].map((c, i) => Math.round(c + (VIRIDIS[low + 1][i] - c) * (position - low)));
});
const ZERO_RGB = [217, 217, 217];

// An (n, n) matrix as an n x n pixel canvas (CSS scales it up, unsmoothed).
function thumbnail(weights) {
  const n = weights.length;
  const canvas = element("canvas", {width: n, height: n, "aria-hidden": "true"});
  const context = canvas.getContext("2d");
  const image = context.createImageData(n, n);
  weights.forEach((row, i) => row.forEach((value, j) => {
    const rgb = value === 0 ? ZERO_RGB : LEVELS[Math.round(Math.min(Math.max(value, 0), 1) * 255)];
    image.data.set([...rgb, 255], 4 * (i * n + j));
  }));
  context.putImageData(image, 0, 0);
  return canvas;
}

function showModelError(failure, status = "The API refused the request.") {
  $("#model-error").textContent = failure.message;
  $("#model-error").hidden = false;
  $("#model-status").textContent = status;
}

// Options 0..; the previous choice is kept when the new answer still has it.
function fillSelect(selector, values, noun) {
  const select = $(selector);
  const kept = select.value;
  select.replaceChildren(...values.map((value) => element("option", {value}, `${noun} ${value}`)));
  if (values.map(String).includes(kept)) select.value = kept;
}

// The chosen layer and head as the service's SVG heatmap, labelled with the word pieces.
let headDrawing = 0;  // a later choice wins over a slower, earlier drawing
async function showHead(answer) {
  const layer = Number($("#layer").value);
  const head = Number($("#head").value);
  const entry = answer.layers.find((item) => item.layer === layer);
  const drawing = ++headDrawing;
  const weights = entry.weights[entry.heads.indexOf(head)];
  let picture, note = "";
  try {
    picture = svgNode(await postJson("v1/heatmap", {
      weights, row_labels: answer.tokens, col_labels: answer.tokens, title: `Layer ${layer}, head ${head}`,
    }), "model-head");
  } catch (failure) {  // past max_heatmap_cells (over 128 word pieces): the same cells, unlabelled
    picture = thumbnail(weights);
    picture.classList.add("enlarged");
    note = ` (drawn without labels: ${failure.message})`;
  }
  if (drawing !== headDrawing) return;
  $("#model-heatmap").replaceChildren(element("figure", {class: "heatmap", "data-layer": layer, "data-head": head},
    picture,
    element("figcaption", {}, `Layer ${layer}, head ${head} of ${answer.layers.length} layers × ` +
      `${entry.heads.length} heads: rows are queries, columns keys${note}`)));
  for (const button of document.querySelectorAll("#model-view button")) {
    const chosen = Number(button.dataset.layer) === layer && Number(button.dataset.head) === head;
    button.setAttribute("aria-pressed", String(chosen));
  }
}

// BertViz's model view: a layers x heads grid of small heatmaps; ``choose(layer, head)`` enlarges one.
function showModelView(answer, choose) {
  const heads = answer.layers[0].heads;
  const view = $("#model-view");
  view.style.setProperty("--heads", heads.length);
  const header = [element("span", {class: "view-label corner"}, "layer ↓ head →"),
    ...heads.map((head) => element("span", {class: "view-label"}, String(head)))];
  const rows = answer.layers.flatMap((entry) => [element("span", {class: "view-label"}, String(entry.layer)),
    ...entry.weights.map((weights, k) => {
      const [layer, head] = [entry.layer, entry.heads[k]];
      const button = element("button", {type: "button", class: "thumb", "data-layer": layer, "data-head": head,
        "aria-label": `Enlarge layer ${layer}, head ${head}`, "aria-pressed": "false"}, thumbnail(weights));
      button.addEventListener("click", () => choose(layer, head));
      return button;
    })]);
  view.replaceChildren(...header, ...rows);
}

async function runModel(event) {
  event.preventDefault();
  $("#model-error").hidden = true;
  $("#run-model").disabled = true;
  $("#model-status").textContent = "Running the model…";
  try {
    const body = {text: $("#text").value};
    if ($("#text-pair").value.trim()) body.text_pair = $("#text-pair").value;
    const answer = await postJson(`v1/models/${encodeURIComponent($("#model").value)}/attention`, body);
    fillSelect("#layer", answer.layers.map((entry) => entry.layer), "layer");
    fillSelect("#head", answer.layers[0].heads, "head");
    const show = () => showHead(answer).catch(showModelError);
    $("#layer").onchange = show;
    $("#head").onchange = show;
    showModelView(answer, (layer, head) => {
      $("#layer").value = layer;
      $("#head").value = head;
      show();
      $("#head-heading").scrollIntoView({block: "start"});
    });
    $("#model-tokens").replaceChildren(...answer.tokens.map((token, i) =>
      element("code", {title: `id ${answer.token_ids[i]}`}, token)));
    await showHead(answer);
    $("#model-results").hidden = false;
    $("#model-status").textContent = `Done: ${answer.layers.length} layers × ${answer.layers[0].heads.length} ` +
      `heads over ${answer.tokens.length} word pieces.`;
  } catch (failure) {
    // As in the toy mode: the previous sentence's heads must not pass for this one's.
    $("#model-results").hidden = true;
    $("#model-heatmap").replaceChildren();
    $("#model-view").replaceChildren();
    showModelError(failure, "Nothing computed (see below); the earlier results are cleared.");
  } finally {
    $("#run-model").disabled = false;
  }
}

function describeModel(model) {
  $("#model-info").textContent = `${model.architecture}: ${model.n_layers} layers × ${model.n_heads} heads, ` +
    `d_model ${model.d_model}, max_positions ${model.max_positions}; licence ${model.license ?? "not stated"}; ` +
    `from ${model.source}.`;
}

async function loadModels() {
  const {models} = await api("v1/models");
  const select = $("#model");
  select.replaceChildren(...models.map((model) => element("option", {value: model.name}, model.name)));
  select.onchange = () => describeModel(models.find((model) => model.name === select.value));
  if (!models.length) {
    select.disabled = true;
    $("#run-model").disabled = true;
    $("#model-info").textContent = "This server serves no model (its ATTENTION_MODELS setting is empty): " +
      "the real-model mode has nothing to run.";
    return;
  }
  describeModel(models[0]);
}

// The models are asked for on the first visit to the real mode only: the toy mode never calls them.
function chooseMode() {
  const real = $("#mode-real").checked;
  $("#toy-mode").hidden = real;
  $("#real-mode").hidden = !real;
  const select = $("#model");
  if (!real || select.dataset.loaded) return;
  select.dataset.loaded = "yes";
  loadModels().catch((failure) => {
    $("#model-error").textContent = `Could not load the models: ${failure.message}`;
    $("#model-error").hidden = false;
  });
}

function chooseSource() {
  const tokens = $("#source-tokens").checked;
  $("#tokens-input").hidden = !tokens;
  $("#embeddings-input").hidden = tokens;
  $("#d-model").disabled = !tokens;
}

document.addEventListener("DOMContentLoaded", () => {
  $("#run-form").addEventListener("submit", run);
  $("#clear-tokens").addEventListener("click", () => {
    $("#tokens").value = "";
    $("#tokens").focus();
  });
  for (const radio of document.querySelectorAll("input[name=source]")) radio.addEventListener("change", chooseSource);
  chooseSource();
  $("#model-form").addEventListener("submit", runModel);
  for (const radio of document.querySelectorAll("input[name=mode]")) radio.addEventListener("change", chooseMode);
  if (location.hash === "#real-mode") $("#mode-real").checked = true;  // a link straight to the real model
  chooseMode();
  Promise.all([loadVocabulary(), loadDemos()]).catch((failure) => {
    $("#error").textContent = `Could not load the vocabulary or the demos: ${failure.message}`;
    $("#error").hidden = false;
  });
});
