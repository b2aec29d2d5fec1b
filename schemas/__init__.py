"""marshmallow schemas of the HTTP service: requests, responses, problems; the tensor fields."""
