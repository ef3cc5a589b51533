#!/usr/bin/env python3
"""Cascade from Python over gRPC: streams a Generate (a shared system chunk plus a query), repeats
it to show the prefix cache at work, then holds a two-turn Chat session.

    bash clients/python/generate_stubs.sh                 # once: stubs into clients/python/gen
    /usr/bin/python3 clients/python/cascade_client.py --gateway localhost:50051

Needs Debian's python3-grpcio and python3-protobuf (scripts/setup.sh installs them). Prints what
it streams; exits 1 if a check fails (the cached repeat must stream the cold run's tokens)."""
import argparse
import os
import sys

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--gateway", default="localhost:50051", help="gateway host:port")
parser.add_argument("--stubs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"),
                    help="directory of the generated stubs (generate_stubs.sh)")
parser.add_argument("--max_tokens", type=int, default=16)
parser.add_argument("--token", default="", help="bearer token, if the gateway has --auth_token")
args = parser.parse_args()
sys.path.insert(0, args.stubs)

import grpc  # noqa: E402
from cascade.v2 import common_pb2, gateway_pb2, gateway_pb2_grpc  # noqa: E402

SYSTEM = "You are Cascade's example assistant. " * 12


def chunk(kind, text):
    return gateway_pb2.Chunk(kind=kind, text=text)


def generate(stub, query, metadata):
    req = gateway_pb2.GenerateRequest(
        chunks=[chunk(common_pb2.CHUNK_KIND_SYSTEM, SYSTEM), chunk(common_pb2.CHUNK_KIND_QUERY, query)],
        sampling=common_pb2.SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True))
    tokens, text, usage = [], "", None
    for event in stub.Generate(req, timeout=120, metadata=metadata):
        kind = event.WhichOneof("event")
        if kind == "start":
            print(f"  start: worker {event.start.worker_id}, prompt {event.start.prompt_tokens} tokens, "
                  f"{event.start.cached_tokens} cached")
        elif kind == "delta":
            tokens.extend(event.delta.token_ids)
            text += event.delta.text
            sys.stdout.write(event.delta.text)
            sys.stdout.flush()
        elif kind == "finish":
            usage = event.finish.usage
            print(f"\n  finish: {common_pb2.FinishReason.Name(event.finish.finish_reason)}, "
                  f"{usage.completion_tokens} tokens")
    return tokens, text, usage


def main():
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else []
    with grpc.insecure_channel(args.gateway) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        models = stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=10, metadata=metadata)
        print(f"model: {models.models[0].name} ({models.models[0].workers} workers)")

        print("Generate, cold:")
        cold, _, _ = generate(stub, "What does a prefix cache save?", metadata)
        print("Generate, repeat (the system chunk is cached now):")
        warm, _, usage = generate(stub, "What does a prefix cache save?", metadata)
        if usage.cached_tokens <= 0 or warm != cold:
            print(f"FAIL: cached {usage.cached_tokens} tokens; tokens equal: {warm == cold}")
            return 1
        print(f"  cached == cold: OK ({usage.cached_tokens} of {usage.prompt_tokens} prompt tokens reused)")

        print("Chat, two turns:")
        turns = iter([
            gateway_pb2.ChatRequest(
                chunks=[chunk(common_pb2.CHUNK_KIND_SYSTEM, SYSTEM), chunk(common_pb2.CHUNK_KIND_QUERY, "Hello!")],
                sampling=common_pb2.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)),
            gateway_pb2.ChatRequest(
                chunks=[chunk(common_pb2.CHUNK_KIND_QUERY, "And again?")],
                sampling=common_pb2.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)),
        ])
        finishes = []
        for resp in stub.Chat(turns, timeout=120, metadata=metadata):
            if resp.event.WhichOneof("event") == "finish":
                u = resp.event.finish.usage
                finishes.append(u)
                print(f"  turn {resp.turn}: prompt {u.prompt_tokens} tokens, {u.cached_tokens} cached, "
                      f"{u.completion_tokens} generated")
        if len(finishes) != 2 or finishes[1].cached_tokens <= 0:
            print("FAIL: the second chat turn should reuse the session's tokens")
            return 1
        print("python client: OK")
        return 0


if __name__ == "__main__":
    sys.exit(main())
