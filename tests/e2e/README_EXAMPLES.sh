#!/usr/bin/env bash
# The grpcurl commands users are shown, in one place: the README quotes them verbatim, and
# tests/e2e/grpcurl_e2e_test.sh runs every one of them against a real stack (with grpcurl played
# by tests/e2e/grpcurl.js, which learns the API only through server reflection).
#
# Start a local stack on these ports first:
#   build/bin/cascade up --port 50051 --registry_port 50052 --certs_dir /tmp/cascade-certs
# then run the lines below one by one, or this whole file: bash tests/e2e/README_EXAMPLES.sh
# The gateway's port is public (plaintext here); the registry's is internal: only a certificate
# from the stack's CA gets in, and its admin RPCs need the admin one that `cascade up` wrote.
#
# Format (the test parses it): each example is a `## name: what it shows` line followed by one
# command line starting with `grpcurl`. The gateway is localhost:50051, the registry
# localhost:50052 and the certificates /tmp/cascade-certs; the test substitutes the ports and the
# certificates' directory it got and nothing else.

## list: the services the gateway serves
grpcurl -plaintext localhost:50051 list

## describe: the public API, from reflection
grpcurl -plaintext localhost:50051 describe cascade.v2.GatewayService

## health: SERVING once a worker is up
grpcurl -plaintext localhost:50051 grpc.health.v1.Health/Check

## list-models: the served model, its context length and worker count
grpcurl -plaintext localhost:50051 cascade.v2.GatewayService/ListModels

## tokenize: token ids of plain text
grpcurl -plaintext -d '{"text":"Hello, Cascade!"}' localhost:50051 cascade.v2.GatewayService/Tokenize

## generate: a start (routing, prompt and cached tokens per chunk), token deltas, a finish
grpcurl -plaintext -d '{"chunks":[{"kind":"CHUNK_KIND_SYSTEM","text":"You are terse."},{"kind":"CHUNK_KIND_QUERY","text":"Hi"}],"sampling":{"maxTokens":8,"temperature":0}}' localhost:50051 cascade.v2.GatewayService/Generate

## generate-again: the same request again; its start reports cachedTokens > 0 and the tokens are the same
grpcurl -plaintext -d '{"chunks":[{"kind":"CHUNK_KIND_SYSTEM","text":"You are terse."},{"kind":"CHUNK_KIND_QUERY","text":"Hi"}],"sampling":{"maxTokens":8,"temperature":0}}' localhost:50051 cascade.v2.GatewayService/Generate

## invalid: bad input is answered INVALID_ARGUMENT naming the field (grpcurl exits 64 + 3 = 67)
grpcurl -plaintext -d '{"chunks":[{"kind":"CHUNK_KIND_QUERY","text":"Hi"}],"sampling":{"maxTokens":0}}' localhost:50051 cascade.v2.GatewayService/Generate

## score: a prompt scored (vLLM's prompt_logprobs): deltas with each prompt token's logprob, rank and top token, then the generated one
grpcurl -plaintext -d '{"chunks":[{"kind":"CHUNK_KIND_RAW","text":"The capital of France is Paris."}],"sampling":{"maxTokens":1,"temperature":0,"promptLogprobs":1}}' localhost:50051 cascade.v2.GatewayService/Generate

## list-chunks: the registry's admin view of the chunks and which worker holds them
grpcurl -cacert /tmp/cascade-certs/ca.crt -cert /tmp/cascade-certs/admin.crt -key /tmp/cascade-certs/admin.key -servername registry.cascade.internal localhost:50052 cascade.v2.ChunkRegistryService/ListChunks

## list-workers: the registry's live workers with their load
grpcurl -cacert /tmp/cascade-certs/ca.crt -cert /tmp/cascade-certs/admin.crt -key /tmp/cascade-certs/admin.key -servername registry.cascade.internal localhost:50052 cascade.v2.ChunkRegistryService/ListWorkers

## registry-needs-a-certificate: without a certificate the registry lets nothing in, reflection included (Unauthenticated, grpcurl exits 1)
grpcurl -cacert /tmp/cascade-certs/ca.crt -servername registry.cascade.internal localhost:50052 cascade.v2.ChunkRegistryService/ListWorkers
