// Swagger UI for the service's own spec, every asset served by the service (works offline).
"use strict";

window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",  // relative: "Try it out" talks to whichever server served this page
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,  // no request to the public validator badge service
    tryItOutEnabled: true,
    displayRequestDuration: true,
    defaultModelsExpandDepth: 0,
  });
});
