// The real model's readings beyond raw weights: a toggle between the chosen layer and head's raw weights (drawn by
// playground.js), their norms beside them, the rollout after the layer and the flow to the last layer, each the
// service's own picture (POST /v1/models/{model}/explain?format=svg). Uses playground.js's $, api and svgNode.
"use strict";

let readingInput = null;  // {model, body}: the input of the last answered run ("model-answer"), null after a new one
let readingDrawing = 0;   // a later choice wins over a slower, earlier drawing

// The request that draws ``reading`` for the chosen layer and head: norms of that head (beside its weights),
// rollout after that layer, flow (always to the last layer).
function readingRequest(reading) {
  const body = {...readingInput.body, methods: [reading]};
  if (reading !== "flow") body.layers = [Number($("#layer").value)];
  if (reading === "norms") body.heads = [Number($("#head").value)];
  return body;
}

async function showReading() {
  const reading = document.querySelector("input[name=reading]:checked").value;
  const raw = reading === "weights";
  $("#model-heatmap").hidden = !raw;
  $("#reading-heatmap").hidden = raw;
  $("#reading-status").textContent = "";
  if (raw || !readingInput) return;
  const drawing = ++readingDrawing;
  const [layer, head] = [$("#layer").value, $("#head").value];
  $("#reading-status").textContent = `Computing ${reading}…`;
  let shown, status;
  try {
    const svg = await api(`v1/models/${encodeURIComponent(readingInput.model)}/explain?format=svg`, {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(readingRequest(reading)),
    });
    shown = element("figure", {class: "heatmap", "data-reading": reading, "data-layer": layer, "data-head": head},
      svgNode(svg, "reading"));
    status = "";
  } catch (failure) {  // e.g. flow past max_flow_tokens: the API's reason, with its pointer
    shown = element("div", {class: "error", role: "alert"}, failure.message);
    status = `No ${reading} for this input.`;
  }
  if (drawing !== readingDrawing) return;
  $("#reading-heatmap").replaceChildren(shown);
  $("#reading-status").textContent = status;
}

document.addEventListener("DOMContentLoaded", () => {
  $("#model-form").addEventListener("submit", () => {  // a new input: nothing of the last one's stays drawn
    readingInput = null;
    readingDrawing++;
    $("#reading-heatmap").replaceChildren();
  });
  $("#model-results").addEventListener("model-answer", (event) => {
    readingInput = event.detail;
    showReading();
  });
  for (const radio of document.querySelectorAll("input[name=reading]")) radio.addEventListener("change", showReading);
  $("#model-view").addEventListener("click", showReading);  // a thumbnail chose a layer and head (playground.js)
  $("#layer").addEventListener("change", showReading);
  $("#head").addEventListener("change", showReading);
});
