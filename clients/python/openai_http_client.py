#!/usr/bin/env python3
"""Cascade's OpenAI-compatible HTTP API from plain Python (standard library only): a streamed chat
completion read as server-sent events, then the same request whole, which reports the cached
prompt tokens.

    /usr/bin/python3 clients/python/openai_http_client.py --base http://localhost:8000/v1

(Start the stack with `cascade up --http_port 8000`.) Exits 1 if a check fails."""
import argparse
import json
import sys
import urllib.error
import urllib.request

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--base", default="http://localhost:8000/v1")
args = parser.parse_args()

BODY = {
    "messages": [{"role": "system", "content": "You are terse. " * 30},
                 {"role": "user", "content": "Name a prime number."}],
    "max_tokens": 12, "temperature": 0, "ignore_eos": True,
}


def post(path, body):
    req = urllib.request.Request(args.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


def main():
    text = ""
    with post("/chat/completions", dict(BODY, stream=True)) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                piece = choice["delta"].get("content") or ""
                text += piece
                sys.stdout.write(piece)
    print()
    with post("/chat/completions", BODY) as resp:
        whole = json.load(resp)
    cached = whole["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"usage: {whole['usage']}")
    if whole["choices"][0]["message"]["content"] != text or cached <= 0:
        print("FAIL: the repeat should reuse the prompt and give the same text")
        return 1
    try:
        post("/chat/completions", dict(BODY, temperature=5))
        print("FAIL: temperature 5 was accepted")
        return 1
    except urllib.error.HTTPError as e:
        err = json.load(e)
        print(f"bad input: HTTP {e.code}, {err['error']['type']}: {err['error']['message']}")
        if e.code != 400:
            return 1
    print("openai http client: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
