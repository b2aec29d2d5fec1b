// The real model's interventions, on demand (POST /v1/models/{model}/explain, methods knockout and occlusion):
// a bar per occluded word piece under the word pieces, and under the model view a layers x heads table of how far
// knocking out each head moved the model's answer, whose cells choose that head in the model view. Each is its own
// request, so a refused one (past max_knockouts or max_rerun_tokens) leaves the other drawn. Uses playground.js's
// $, element, postJson, matrixTable, positions and LEVELS, and generate.js's visible.
"use strict";

let interventionInput = null;  // {model, body}: the last answered run's input ("model-answer"), null after a new one
const interventionAsked = {occlusion: 0, knockout: 0};  // per method, a later request wins over a slower, earlier one
let knockedLayer = null;  // the layer whose heads the last knockout asked for, null: every head

// How an answer measures a run against the full one: an encoder by its sentence embedding, a decoder by its
// next-token probabilities (and whether its top token changed).
function measures(answer) {
  if ("kl" in answer) {
    return {key: "kl", name: "KL divergence", unit: " nats", flag: "top_changed", also: (changed) => (changed ?
      `; the top next token changed (from “${visible(answer.next_token.token)}”)` : "; the same top next token")};
  }
  return {key: "cosine_distance", name: "cosine distance", unit: "", flag: "largest_change",
    also: (change) => `; a position's last hidden state moved by at most ${change.toFixed(3)}`};
}

// A measure written short: 2 significant digits (cosine distances are small).
const short = (value) => String(Number(value.toPrecision(2)));

// The heads knockout asks for: every head, or those of the chosen layer.
function knockRequest() {
  knockedLayer = $("#knock-scope").value === "layer" ? Number($("#layer").value) : null;
  if (knockedLayer === null) return {};
  return {knock: [...$("#head").options].map((option) => [knockedLayer, Number(option.value)])};
}

// The occlusion bars: one per occluded position, as tall as its measure against the largest, the word piece under it.
function drawOcclusion({occlusion, tokens}) {
  const measure = measures(occlusion);
  const values = occlusion[measure.key];
  const largest = Math.max(...values) || 1;
  const bars = occlusion.positions.map((position, k) => {
    const [value, token] = [values[k], visible(tokens[position])];
    const title = `“${token}” (position ${position}): ${measure.name} ${value}${measure.unit}` +
      measure.also(occlusion[measure.flag][k]);
    return element("li", {title, "data-position": position, "data-value": value,
      class: occlusion[measure.flag][k] === true ? "changed" : ""},
    element("span", {class: "bar", style: `height: ${(100 * value / largest).toFixed(1)}%`}),
    element("code", {}, token), element("span", {class: "visually-hidden"}, `: ${short(value)}`));
  });
  const next = occlusion.next_token ? ` The full run's next token is “${visible(occlusion.next_token.token)}”; ` +
    "a bar in orange changed it." : "";
  return [element("p", {class: "help"}, `Each bar is the ${measure.name} between the full run and the run ` +
    `without that word piece, scaled to the largest (${short(largest)}${measure.unit}); hover one for its numbers.` +
    next), element("ol", {class: "occlusion", "aria-label": `Occlusion: ${measure.name} per word piece`}, ...bars)];
}

// The knockout table: a layer a row, a head a column; each knocked-out head a button coloured by its measure
// (viridis, the largest the brightest) that chooses that head in the model view; the heads not knocked out hatched.
function drawKnockout({knockout}) {
  const measure = measures(knockout);
  const table = knockout[measure.key];
  const largest = Math.max(...table.flat().filter((value) => value !== null)) || 1;
  const cells = table.map((row, layer) => row.map((value, head) => {
    if (value === null) return null;
    const level = Math.round(255 * Math.max(value, 0) / largest);
    const button = element("button", {type: "button", class: "knock", "data-layer": layer, "data-head": head,
      "data-value": value, "aria-pressed": "false", "aria-label": `layer ${layer}, head ${head}: ${short(value)}`,
      style: `background: rgb(${LEVELS[level]}); color: ${level < 150 ? "#fff" : "#1b1b1f"}`,
      title: `Layer ${layer}, head ${head} knocked out: ${measure.name} ` +
      `${value}${measure.unit}${measure.also(knockout[measure.flag][layer][head])}. Click to see this head.`},
    short(value), knockout[measure.flag][layer][head] === true ? " ★" : "");
    button.addEventListener("click", () => chooseKnocked(layer, head));
    return button;
  }));
  const next = knockout.next_token ? `; ★: the top next token (“${visible(knockout.next_token.token)}”) ` +
    "changed" : "";
  return [matrixTable(cells, {rows: positions(table.length), cols: positions(table[0].length),
    corner: "layer ↓ head →", name: "knockout",
    caption: `${measure.name} from the full run when one head is knocked out, largest ${short(largest)}` +
      `${measure.unit}${next}`, format: () => "—"})];
}

// A knockout cell chooses its head as the model view's thumbnail does (playground.js's choose, readings.js's too).
function chooseKnocked(layer, head) {
  $(`#model-view button[data-layer="${layer}"][data-head="${head}"]`).click();
}

function markKnocked() {
  for (const button of document.querySelectorAll("#knockout-out button.knock")) {
    const chosen = button.dataset.layer === $("#layer").value && button.dataset.head === $("#head").value;
    button.setAttribute("aria-pressed", String(chosen));
  }
}

const INTERVENTIONS = {
  occlusion: {draw: drawOcclusion, request: () => ({}), busy: () => "Occluding each word piece in turn"},
  knockout: {draw: drawKnockout, request: knockRequest, busy: ({knock}) => `Knocking out ${knock ?
    `layer ${knock[0][0]}'s ${knock.length} heads` : "every head"} in turn`},
};

// One method's request for the last answered input, its section busy (the seconds counted) until it is drawn, or
// the API's reason shown where it would have been.
async function intervene(method) {
  const {draw, request, busy} = INTERVENTIONS[method];
  const [section, status, out] = [`#${method}`, `#${method}-status`, `#${method}-out`].map($);
  const asked = ++interventionAsked[method];
  const body = {...interventionInput.body, methods: [method], ...request()};
  const started = performance.now();
  const seconds = element("span", {"aria-hidden": "true"});
  const tick = () => { seconds.textContent = ` ${Math.round((performance.now() - started) / 1000)} s`; };
  const timer = setInterval(tick, 1000);
  tick();
  section.hidden = false;
  section.setAttribute("aria-busy", "true");
  status.replaceChildren(`${busy(body)}, one run each…`, seconds,
    element("progress", {"aria-label": `${method}, under way`}));
  let answer, failure;
  try {
    answer = await postJson(`v1/models/${encodeURIComponent(interventionInput.model)}/explain`, body);
  } catch (error) {
    failure = error;
  } finally {
    clearInterval(timer);
  }
  if (asked !== interventionAsked[method]) return;
  if (failure) {  // a refusal names the limit and what to send instead
    out.replaceChildren(element("div", {class: "error", role: "alert"}, failure.message));
    status.textContent = `No ${method} for this input.`;
  } else {
    out.replaceChildren(...draw(answer));
    status.textContent = `Done in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
  }
  section.removeAttribute("aria-busy");
  if (method === "knockout") markKnocked();
}

// Nothing drawn, and no answer under way will be.
function clearInterventions() {
  for (const method of Object.keys(INTERVENTIONS)) {
    interventionAsked[method]++;
    $(`#${method}`).hidden = true;
    $(`#${method}`).removeAttribute("aria-busy");
    $(`#${method}-out`).replaceChildren();
  }
}

// The toggle: on, both methods for the last input; off, nothing drawn or asked for.
function showInterventions() {
  if (!$("#intervene").checked) clearInterventions();
  else if (interventionInput) Object.keys(INTERVENTIONS).forEach(intervene);
}

// A head chosen in the model view: marked in the table; with the chosen layer's heads knocked out, another
// layer's heads are asked for.
function followChoice() {
  markKnocked();
  const stale = $("#knock-scope").value === "layer" && knockedLayer !== Number($("#layer").value);
  if ($("#intervene").checked && interventionInput && stale) intervene("knockout");
}

document.addEventListener("DOMContentLoaded", () => {
  $("#model-form").addEventListener("submit", () => {  // a new input: nothing of the last one's stays drawn
    interventionInput = null;
    knockedLayer = null;
    clearInterventions();
  });
  $("#model-results").addEventListener("model-answer", (event) => {
    interventionInput = event.detail;
    showInterventions();
  });
  $("#intervene").addEventListener("change", showInterventions);
  $("#knock-scope").addEventListener("change", () => {
    if ($("#intervene").checked && interventionInput) intervene("knockout");
  });
  $("#model-view").addEventListener("click", followChoice);  // a thumbnail chose a layer and head (playground.js)
  $("#layer").addEventListener("change", followChoice);
  $("#head").addEventListener("change", followChoice);
});
