"""The header that carries tritonserver's API key (its --http-restricted-api/--grpc-restricted-api key)."""

API_KEY_HEADER = "triton-api-key"
GRPC_API_KEY_HEADER = f"triton-grpc-protocol-{API_KEY_HEADER}"  # Triton prefixes the gRPC one
