// Swagger UI for the service's own spec, every asset served by the service (works offline).
"use strict";

// The page says whether this server asks for API keys (GET /docs fills it in from API_KEYS).
const KEYS_CONFIGURED = document.querySelector('meta[name="api-keys"]').content === "on";

// The spec documents the optional bearer key on every protected operation; a server without keys asks for
// none, so its docs show no lock and no Authorize button.
function withoutKeys(spec) {
  const paths = Object.fromEntries(Object.entries(spec.paths || {}).map(([path, item]) => [path,
    Object.fromEntries(Object.entries(item).map(([method, operation]) => {
      if (operation === null || typeof operation !== "object" || !("security" in operation)) return [method, operation];
      const {security, ...open} = operation;
      return [method, open];
    }))]));
  const {securitySchemes, ...components} = spec.components || {};
  return {...spec, paths, components};
}

const keysAsConfigured = () => ({
  statePlugins: {spec: {wrapActions: {
    updateJsonSpec: (original) => (spec) => original(KEYS_CONFIGURED ? spec : withoutKeys(spec)),
  }}},
});

// Swagger UI shows an SVG answer as XML text: show the picture above it (as an <img>: its scripts, if any, never run).
const svgPictures = () => ({
  wrapComponents: {
    responseBody: (Original, system) => (props) => {
      const React = system.React;
      if (!/^image\/svg\+xml/i.test(props.contentType || "") || typeof props.content !== "string") {
        return React.createElement(Original, props);
      }
      const src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(props.content);
      return React.createElement("div", {className: "svg-answer"},
        React.createElement("img", {src, alt: "The SVG answer, drawn", style: {maxWidth: "100%", background: "#fff"}}),
        React.createElement(Original, props));
    },
  },
});

window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",  // relative: "Try it out" talks to whichever server served this page
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,  // no request to the public validator badge service
    tryItOutEnabled: true,
    displayRequestDuration: true,
    defaultModelsExpandDepth: 0,
    plugins: [keysAsConfigured, svgPictures],
  });
});
