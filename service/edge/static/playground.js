// The attention playground: plain DOM code over the public HTTP API (no framework, no build step).
// The tables show the API's numbers; the page itself adds only what a student would redo by hand (X = E + PE,
// weights·V, the concatenation, the sums behind one chosen cell). Relative URLs so the page works behind a path
// prefix.
"use strict";

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

// One line of a problem's errors: where (a pointer, "" the whole body; a query parameter; a header), then its
// detail, which does not name it again.
function problemLine({pointer, parameter, header, detail}) {
  return `${pointer || parameter || header || "the body"}: ${detail}`;
}

// A problem (RFC 9457) as an Error carrying the API's explanation: one line per error, else its detail.
function problemError(problem, fallback = "The request failed.") {
  const where = (problem.errors || []).map(problemLine);
  return new Error(where.length ? where.join("\n") : problem.detail || fallback);
}

// A failed answer as problemError's Error (a body that is not problem+json is its detail).
async function failedAnswer(response) {
  const type = response.headers.get("Content-Type") || "";
  const problem = type.includes("json") ? await response.json() : {detail: await response.text()};
  return problemError(problem, response.statusText);
}

// fetch JSON or SVG; a problem+json answer becomes an Error carrying the API's explanation.
async function api(path, options = {}) {
  const response = await fetch(path, options);
  if (!response.ok) throw await failedAnswer(response);
  const type = response.headers.get("Content-Type") || "";
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
// ("query ↓ key →"). ``format(value, j)`` writes the value of column j; a Node cell is put in as it is. Cells
// carry data-row and data-col; ``name`` and ``pick`` (what a click on a cell chooses) go on the table.
function matrixTable(matrix, {rows, cols, corner, caption, format = (value) => formatNumber(value, true), name, pick}) {
  const head = element("tr", {}, element("th", {scope: "col", class: "axes"}, corner),
    ...cols.map((label) => element("th", {scope: "col"}, label)));
  const body = matrix.map((row, i) => element("tr", {}, element("th", {scope: "row"}, rows[i]),
    ...row.map((value, j) => (value instanceof Node ? element("td", {class: "text", "data-row": i, "data-col": j},
      value) : element("td", {class: value === null || value === false ? "masked" : "", "data-row": i,
      "data-col": j}, format(value, j))))));
  const table = element("table", {...name && {"data-name": name}, ...pick && {"data-pick": pick}},
    element("caption", {}, caption), element("thead", {}, head), element("tbody", {}, ...body));
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
  if (Array.isArray(body.embeddings?.[0]?.[0])) {  // the API would take a batch; the page shows one sentence
    throw new Error("/embeddings: one sentence at a time here: n rows of d_model numbers, not a batch.");
  }
  const count = Array.isArray(body.embeddings) ? body.embeddings.length : 0;
  return {body, labels: Array.from({length: count}, (_, i) => String(i))};
}

// The step-by-step: one head from the input X to the output, with one cell (query i, key j, component t of the
// head's q, k, v and weights·V, dimension d of the output) worked out by hand at every step, with the weights the
// trace carries (w_q, w_k, w_v per head, w_o). The head, i, j, t and d are the five selects above the steps.

const SCORE_STEPS = [
  ["scores", "Raw scores Q·Kᵀ", "How well each query matches each key: the dot product of their vectors."],
  ["scaled_scores", "Scaled", "Divided by √d_k so that wide heads do not push the softmax to a hard argmax."],
  ["masked_scores", "Masked", "Positions a token may not see are set to −∞ (shown as “masked”)."],
  ["weights", "Softmax weights", "exp of each score over the row's sum: every row now sums to 1."],
];

const fixed = (value) => value.toFixed(3);
const factor = (value) => (value < 0 ? `(${fixed(value)})` : fixed(value));  // 0.5 × (-1.2), not 0.5 × -1.2
// A sum written term by term; a wide head's (d_k 64) is cut to its first terms and their count.
const sumText = (terms) => (terms.length <= 8 ? terms.join(" + ") :
  `${terms.slice(0, 3).join(" + ")} + … (${terms.length} terms)`);
// A worked number: 3 decimals as in the tables, its exact value in data-value.
const worked = (value) => element("span", {class: "value", "data-value": value}, fixed(value));

// The input the heads read: E (the toy vocabulary's vectors from the API, or the pasted matrix), the API's
// positional encoding PE, and X = E + PE; each (n, d_model).
async function readInput(body, n) {
  const embeddings = body.tokens ? (await postJson("v1/embed", {tokens: body.tokens, d_model: body.d_model}))
    .embeddings : body.embeddings;
  if (!body.positional_encoding) return {embeddings, encoding: null, x: embeddings};
  const {encoding} = await api(`v1/positional-encoding?n_positions=${n}&d_model=${embeddings[0].length}`);
  return {embeddings, encoding, x: embeddings.map((row, i) => row.map((value, c) => value + encoding[i][c]))};
}

// weights·V per head, (h, n, d_k): the API's output is after the heads are mixed, so this step is redone here.
function headOutputs(trace) {
  return trace.weights.map((weights, h) => weights.map((row) => trace.v[h][0].map((_, t) =>
    row.reduce((sum, weight, j) => sum + weight * trace.v[h][j][t], 0))));
}

// The head, query i, key j, component t and output dimension d the five selects (or the last click) chose.
const CHOICES = ["#trace-head", "#trace-query", "#trace-key", "#trace-component", "#trace-dimension"];
const chosen = () => CHOICES.map((id) => Number($(id).value));

// What a click on a cell of a table chooses, by the table's data-pick: its row, then its column.
const PICKS = {key: ["#trace-query", "#trace-key"], component: ["#trace-query", "#trace-component"],
  "key-component": ["#trace-key", "#trace-component"], dimension: ["#trace-query", "#trace-dimension"]};

// row · column ``c`` of ``matrix``, summed in order as the worked line writes it.
const product = (row, matrix, c) => row.reduce((sum, value, m) => sum + value * matrix[m][c], 0);

// A weight matrix of more cells than this (W_o past d_model 64) is drawn only once its <details> is opened:
// drawn at every redraw, d_model 512's W_o and W_q, W_k, W_v (360,000 cells) took a redraw from 3 s to 13 s.
const OPEN_CELLS = 4096;

// ``draw()``'s table, or past OPEN_CELLS a closed <details> that draws it when first opened, then ``drawn()``.
function drawnWhenOpened(cells, caption, draw, drawn) {
  if (cells <= OPEN_CELLS) return draw();
  const details = element("details", {class: "large"},
    element("summary", {}, `${caption}: ${cells.toLocaleString("en")} numbers, drawn when opened`));
  details.addEventListener("toggle", () => {
    if (!details.open || details.dataset.drawn) return;
    details.dataset.drawn = "yes";
    details.append(draw());
    drawn();
  });
  return details;
}

// The chosen head's steps as tables; then its chosen cell worked out (workCell).
function drawTrace(steps) {
  const {answer: {trace, output}, labels, input, outputs, positional} = steps;
  const [head] = chosen();
  const [heads, d_k, width] = [trace.q.length, trace.q[0][0].length, output[0].length];
  const tokenTable = (matrix, caption, name, pick) => matrixTable(matrix, {rows: labels,
    cols: positions(matrix[0].length), corner: "token ↓ dimension →", caption, name, pick});
  // A projection's weights: a row per dimension of X (or column of the concatenation), a column per output one.
  const weightTable = (matrix, caption, name, rows, corner) => drawnWhenOpened(matrix.length * matrix[0].length,
    caption, () => matrixTable(matrix, {rows, cols: positions(matrix[0].length), corner, caption, name}),
    () => workCell(steps));  // its cells used, highlighted
  const concatColumns = outputs.flatMap((_, g) => positions(d_k).map((c) => `${g}·${c}`));
  const step = (name, title, help, ...tables) => element("li", {"data-step": name}, element("h3", {}, title),
    element("p", {class: "help"}, help), element("div", {class: "tables"}, ...tables),
    element("p", {class: "worked"}));
  $("#trace").replaceChildren(
    step("input", positional ? "Input: embeddings + positional encoding" : "Input: the embeddings",
      `${positional ? "X = E + PE: each token's embedding plus the sinusoidal encoding of its position."
        : "X = E: the embeddings as they are (the positional encoding is off)."} Every head reads this same X.`,
    ...(positional ? [tokenTable(input.embeddings, "E, the embeddings"), matrixTable(input.encoding, {
      rows: positions(labels.length), cols: positions(width), corner: "position ↓ dimension →",
      caption: "PE, the positional encoding"})] : []), tokenTable(input.x, "X, the input", "x")),
    step("qkv", `Q, K and V of head ${head}`, `Q = X·W_q, K = X·W_k, V = X·W_v, each n × d_k with d_k = ` +
      `d_model / heads = ${width} / ${heads} = ${d_k}: component c of a token's q is its row of X times column c ` +
      `of W_q. This head's W_q, W_k, W_v (d_model × d_k) are random, drawn from seed + ${head}. Click a cell of ` +
      "Q, K or V for its sum.",
    ...["q", "k", "v"].map((letter) => weightTable(trace[`w_${letter}`][head], `W_${letter}, head ${head}`,
      `w_${letter}`, positions(width), "dimension ↓ component →")),
    tokenTable(trace.q[head], "Q", "q", "component"), tokenTable(trace.k[head], "K", "k", "key-component"),
    tokenTable(trace.v[head], "V", "v", "key-component")),
    ...SCORE_STEPS.map(([key, title, help]) => step(key, title, help, matrixTable(trace[key][head], {
      rows: labels, cols: labels, corner: "query ↓ key →", caption: `${title}, head ${head}`, name: key,
      pick: "key"}))),
    step("head-output", `weights·V: head ${head}'s output`, "Each query's output is the average of the value " +
      "vectors (the rows of V), weighted by its row of softmax weights: n × d_k. Click a cell for its sum.",
    tokenTable(outputs[head], `weights·V, head ${head}`, "head-output", "component")),
    step("concat", "Concatenate the heads", `The ${heads} heads' outputs side by side, n × d_model: head ` +
      `${head}'s are the columns ${head}·0 to ${head}·${d_k - 1}.`,
    matrixTable(steps.concat, {rows: labels, cols: concatColumns, corner: "token ↓ head·component →",
      caption: "The heads concatenated", name: "concat"})),
    step("output", "Mix with W_o: the output", "output = concat·W_o: W_o (d_model × d_model, random, drawn from " +
      "seed + 99) mixes the heads, each output dimension a row of the concatenation times a column of W_o. The " +
      "output is as wide as the input, which is what lets blocks be stacked. Click a cell for its sum.",
    weightTable(trace.w_o, "W_o", "w_o", concatColumns, "head·component ↓ dimension →"),
    tokenTable(output, "Output, all heads", "output", "dimension")),
  );
  workCell(steps);
}

// Highlight, in table ``name``, the cells in ``rows`` x ``cols`` (null: all of them).
function mark(name, rows, cols) {
  for (const cell of document.querySelectorAll(`#trace table[data-name="${name}"] td`)) {
    const [i, j] = [Number(cell.dataset.row), Number(cell.dataset.col)];
    if ((rows === null || rows.includes(i)) && (cols === null || cols.includes(j))) cell.classList.add("chosen");
  }
}

// The chosen cell by hand, step by step, under each step's tables.
function workCell(steps) {
  const {answer: {trace}, labels, outputs, concat} = steps;
  const [head, i, j, t, d] = chosen();
  const [query, key, q, k] = [labels[i], labels[j], trace.q[head][i], trace.k[head][j]];
  const say = (name, ...parts) => $(`#trace [data-step="${name}"] .worked`).replaceChildren(...parts);
  const score = q.reduce((sum, value, c) => sum + value * k[c], 0);
  const root = Math.sqrt(q.length);
  const {embeddings, encoding, x} = steps.input;
  say("input", `q[${query}] is computed from x[${query}], k[${key}] from x[${key}] (highlighted)`,
    ...(encoding ? [`; x[${query}, 0] = e[${query}, 0] + pe[${i}, 0] = ${fixed(embeddings[i][0])} + ` +
      `${factor(encoding[i][0])} = `, worked(x[i][0])] : []), ".");
  // Component t of q[query], k[key] and v[key]: their row of X times column t of this head's W_q, W_k, W_v.
  const projection = (letter, token, row) => {
    const w = trace[`w_${letter}`][head];
    return element("span", {class: "line"}, `${letter}[${token}, ${t}] = Σ x[${token}, m] × W_${letter}[m, ${t}] = `,
      sumText(row.map((value, m) => `${factor(value)} × ${factor(w[m][t])}`)), " = ", worked(product(row, w, t)));
  };
  say("qkv", projection("q", query, x[i]), projection("k", key, x[j]), projection("v", key, x[j]));
  say("scores", `score[${query} → ${key}] = q[${query}] · k[${key}] = `,
    sumText(q.map((value, c) => `${factor(value)} × ${factor(k[c])}`)), " = ", worked(score));
  say("scaled_scores", `${fixed(score)} / √${q.length} = ${fixed(score)} / ${fixed(root)} = `, worked(score / root));
  const row = trace.masked_scores[head][i];
  say("masked_scores", ...(row[j] === null ? [`masked: ${query} may not see ${key}, so the score becomes −∞.`]
    : [`${query} may see ${key}: the score stays `, worked(row[j])]));
  const seen = row.filter((value) => value !== null);
  const top = Math.max(...seen);
  const exps = seen.map((value) => Math.exp(value - top));
  const total = exps.reduce((sum, value) => sum + value, 0);
  const keys = seen.length === 1 ? "the one key" : `the ${seen.length} keys`;
  say("weights", ...(row[j] === null ? [`weight[${query} → ${key}] = exp(−∞) / … = `, worked(0),
    ": a masked key gets nothing."] : [`weight[${query} → ${key}] = exp(s − m) / Σ exp(s′ − m) over ${keys} ` +
    `${query} sees, m = ${fixed(top)} their largest score (it changes nothing but keeps exp finite) = ` +
    `${fixed(Math.exp(row[j] - top))} / (${sumText(exps.map(fixed))}) = `, worked(Math.exp(row[j] - top) / total)]));
  const weights = trace.weights[head][i];
  say("head-output", `out[${query}, ${t}] = Σ weight[${query} → key] × v[key, ${t}] = `,
    sumText(weights.flatMap((weight, c) => (weight > 0 ? [`${fixed(weight)} × ${factor(trace.v[head][c][t])}`]
      : []))), " = ", worked(outputs[head][i][t]), weights.includes(0) ? " (keys of weight 0 left out)" : "");
  const column = head * q.length + t;
  say("concat", `concat[${query}, ${head}·${t}] = out[${query}, ${t}] of head ${head} = `,
    worked(concat[i][column]), ".");
  say("output", `output[${query}, ${d}] = Σ concat[${query}, m] × W_o[m, ${d}] = `,
    sumText(concat[i].map((value, m) => `${factor(value)} × ${factor(trace.w_o[m][d])}`)), " = ",
    worked(product(concat[i], trace.w_o, d)));
  for (const cell of document.querySelectorAll("#trace td.chosen")) cell.classList.remove("chosen");
  mark("x", [i, j], null);
  for (const name of ["w_q", "w_k", "w_v"]) mark(name, null, [t]);
  mark("q", [i], null);
  mark("k", [j], null);
  mark("v", null, [t]);
  for (const [name] of SCORE_STEPS) mark(name, [i], [j]);
  mark("head-output", [i], [t]);
  mark("concat", [i], null);  // concat[i][column] is this head's; the output step reads the whole row
  mark("w_o", null, [d]);
  mark("output", [i], [d]);
}

// A run's step-by-step: the selects filled (a choice kept while the new run still has it), clicks wired.
function showSteps(steps) {
  const {answer: {trace}, labels} = steps;
  const tokens = (i) => `${labels[i]} (position ${i})`;
  fillSelect("#trace-head", positions(trace.q.length), (h) => `head ${h}`);
  fillSelect("#trace-query", positions(labels.length), tokens, String(Math.min(1, labels.length - 1)));
  fillSelect("#trace-key", positions(labels.length), tokens);
  fillSelect("#trace-component", positions(trace.q[0][0].length), (t) => `component ${t}`);
  fillSelect("#trace-dimension", positions(trace.w_o.length), (d) => `dimension ${d}`);
  $("#trace-head").onchange = () => drawTrace(steps);
  for (const id of CHOICES.slice(1)) $(id).onchange = () => workCell(steps);
  $("#trace").onclick = (event) => {  // e.g. a score or weight cell chooses (i, j), a cell of weights·V (i, t)
    const cell = event.target.closest("td[data-row]");
    const pick = PICKS[cell?.closest("table").dataset.pick];
    if (!pick) return;
    $(pick[0]).value = cell.dataset.row;
    $(pick[1]).value = cell.dataset.col;
    workCell(steps);
  };
  $("#heatmaps").onclick = (event) => {  // a heatmap cell chooses its head, query and key
    const cell = event.target.closest("rect.cell");
    if (!cell) return;
    $("#trace-head").value = cell.closest("figure").dataset.head;
    $("#trace-query").value = cell.dataset.row;
    $("#trace-key").value = cell.dataset.col;
    drawTrace(steps);
    $("#trace-heading").scrollIntoView({block: "start"});
  };
  drawTrace(steps);
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
    // The causal mask goes with the weights: the picture hatches what it hid, unlike a weight that is merely 0.
    const mask = body.causal ? labels.map((_, i) => labels.map((_, j) => j <= i)) : undefined;
    const [pictures, input] = await Promise.all([Promise.all(heads.map((weights, h) => postJson("v1/heatmap", {
      weights, mask, row_labels: labels, col_labels: labels, title: `Head ${h}`,
    }))), readInput(body, labels.length)]);
    $("#heatmaps").replaceChildren(...pictures.map((svg, h) => element("figure", {class: "heatmap", "data-head": h},
      svgNode(svg, `head${h}`),
      element("figcaption", {}, `Head ${h} of ${heads.length}: rows are queries, columns keys; click a cell ` +
        "to work it out below"))));
    const outputs = headOutputs(answer.trace);
    showSteps({answer, labels, input, outputs, positional: body.positional_encoding,
      concat: labels.map((_, i) => outputs.flatMap((out) => out[i]))});
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

// The server heatmaps' palette (viridis, 256 levels: service/operations/palette.py), so that the model view's
// small pictures and the enlarged one read alike. A model's one sentence masks nothing: a 0 is the darkest colour.
const VIRIDIS = ["440154", "482878", "3e4989", "31688e", "26828e", "1f9e89", "35b779", "6ece58", "fde725"]
  .map((hex) => [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16)));
const LEVELS = Array.from({length: 256}, (_, level) => {
  const position = level / 255 * (VIRIDIS.length - 1);
  const low = Math.min(Math.floor(position), VIRIDIS.length - 2);
  return VIRIDIS[low].map((c, i) => Math.round(c + (VIRIDIS[low + 1][i] - c) * (position - low)));
});

// A (rows, n) matrix as a rows x n pixel canvas (CSS scales it up, unsmoothed): a head's (n, n) weights, or the
// generate mode's one row of a token.
function thumbnail(weights) {
  const [rows, n] = [weights.length, weights[0].length];
  const canvas = element("canvas", {width: n, height: rows, "aria-hidden": "true"});
  const context = canvas.getContext("2d");
  const image = context.createImageData(n, rows);
  weights.forEach((row, i) => row.forEach((value, j) => {
    const rgb = LEVELS[Math.round(Math.min(Math.max(value, 0), 1) * 255)];
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

// Options named by ``label(value)``; the previous choice is kept when the new answer still has it, else
// ``fallback`` (default the first) is chosen.
function fillSelect(selector, values, label, fallback) {
  const select = $(selector);
  const kept = select.value;
  select.replaceChildren(...values.map((value) => element("option", {value}, label(value))));
  if (values.map(String).includes(kept)) select.value = kept;
  else if (fallback !== undefined) select.value = fallback;
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
    fillSelect("#layer", answer.layers.map((entry) => entry.layer), (layer) => `layer ${layer}`);
    fillSelect("#head", answer.layers[0].heads, (head) => `head ${head}`);
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
    // readings.js draws the other readings of the chosen layer and head for this input
    $("#model-results").dispatchEvent(new CustomEvent("model-answer", {detail: {model: $("#model").value, body}}));
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

// A mode's list of models (the real-model mode's, generate.js's decoders): each a choice, the chosen one
// described; none: the list and its run button disabled, ``info`` saying why.
function offerModels(models, {select, run, info, none, describe}) {
  const list = $(select);
  list.replaceChildren(...models.map((model) => element("option", {value: model.name}, model.name)));
  list.onchange = () => describe(models.find((model) => model.name === list.value));
  if (!models.length) {
    list.disabled = true;
    $(run).disabled = true;
    $(info).textContent = none;
    return;
  }
  describe(models[0]);
}

async function loadModels() {
  const {models} = await api("v1/models");
  offerModels(models, {select: "#model", run: "#run-model", info: "#model-info", describe: describeModel,
    none: "This server serves no model (its ATTENTION_MODELS setting is empty): the real-model mode has nothing " +
      "to run."});
}

// The models are asked for on the first visit to the real mode only: the toy mode never calls them.
function chooseMode() {
  const real = $("#mode-real").checked;
  $("#toy-mode").hidden = !$("#mode-toy").checked;  // the generate mode (generate.js) is a third
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
