"""Generated code: do not edit; `make clients` rewrites it from clients/openapi.json."""
