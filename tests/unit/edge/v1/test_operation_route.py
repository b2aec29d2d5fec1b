"""service.edge.v1.operation_route: a registry entry becomes a documented /v1 route, path parameters included."""

from __future__ import annotations

import numpy as np

from schemas.reference import CausalMaskQuery, CausalMaskResponse
from service.edge import App
from service.edge.examples import resolved
from service.edge.jsonio import OrjsonProvider
from service.edge.smorest import Blueprint, init_api
from service.edge.v1 import operation_route
from service.operations.inputs import sized
from service.operations.registry import Operation
from service.operations.sizes import Work
from service.settings import Limits


def test_an_operation_with_a_path_parameter_gets_it_in_its_params_and_its_example_documented():
    seen = []

    def compute(prepared):
        params = prepared.params
        seen.append(params)
        return {"mask": np.tri(params["size"], dtype=bool) & (params["model"] != "blind")}

    operation = Operation("model-mask", "test", "A model's mask.\n\nFor the path's model.", CausalMaskQuery,
                          CausalMaskResponse, sized(lambda params: Work()), compute, {"size": 2}, method="GET",
                          path="/models/<model>/mask", path_example={"model": "tiny"})
    app = App(__name__)
    app.json = OrjsonProvider(app)
    app.extensions["limits"] = Limits()
    api = init_api(app)
    blp = Blueprint("test", __name__, url_prefix="/v1")
    operation_route(blp, operation)
    api.register_blueprint(blp)
    assert seen == []  # nothing computed to build the app: the documented answer is worked out by make openapi
    documented = resolved(api.spec.to_dict())["paths"]["/v1/models/{model}/mask"]["get"]
    assert seen[0]["model"] == "tiny"  # with the example's path value

    response = app.test_client().get("/v1/models/blind/mask?size=2")
    assert response.status_code == 200 and response.get_json() == {"mask": [[False, False], [False, False]]}
    assert seen[-1] == {"size": 2, "model": "blind"}
    assert documented["summary"] == "A model's mask."
    assert documented["responses"]["200"]["content"]["application/json"]["example"] == {
        "mask": [[True, False], [True, True]]}
