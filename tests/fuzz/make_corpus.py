#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (tests/fuzz/corpus/<target>/seed-*) from readable
descriptions: proto messages in text format, encoded by protoc, framed the way each target reads
its input. Run from the repository root after changing a seed; regression inputs (crashes found
and fixed) live beside the seeds as regress-* files and are not touched."""
import json
import os
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def encode(message, text, proto):
    return subprocess.run(
        ["protoc", "--encode=cascade.v2." + message, "-I", os.path.join(ROOT, "proto"),
         os.path.join(ROOT, "proto", "cascade", "v2", proto)],
        input=text.encode(), capture_output=True, check=True).stdout


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def gateway():
    gen = [
        ('chunks { kind: CHUNK_KIND_SYSTEM text: "You are terse." } '
         'chunks { kind: CHUNK_KIND_QUERY text: "What is 2+2?" } '
         'sampling { max_tokens: 8 temperature: 0.7 top_p: 0.9 stop: "\\n" } request_id: "r1"'),
        ('model: "qwen3" chunks { kind: CHUNK_KIND_CONTEXT text: "caf\\303\\251 <|im_end|> \\360\\237\\230\\200" } '
         'chunks { kind: CHUNK_KIND_RAW token_ids { ids: 1 ids: 151643 ids: 151668 } } '
         'add_generation_prompt: false sampling { top_k: 5 seed: 7 logprobs: 2 }'),
        ('chunks { kind: CHUNK_KIND_ASSISTANT text: "ok" cache_salt: "tenant" } '
         'chunks { kind: CHUNK_KIND_QUERY text: "again" } cache_salt: "s" '
         'sampling { repetition_penalty: 1.1 min_p: 0.05 stop_token_ids: 151645 ignore_eos: true '
         'logit_bias { key: 9707 value: -100 } logit_bias { key: 11 value: 2.5 } }'),
    ]
    for i, t in enumerate(gen):
        write("gateway_request_fuzz", "generate-%d" % i, b"\x00" + encode("GenerateRequest", t, "gateway.proto"))
    chat = 'session_id: "s1" chunks { kind: CHUNK_KIND_QUERY text: "hi" } sampling { max_tokens: 4 }'
    write("gateway_request_fuzz", "chat", b"\x01" + encode("ChatRequest", chat, "gateway.proto"))
    tok = 'text: "Hello, world! \\344\\275\\240\\345\\245\\275"'
    write("gateway_request_fuzz", "tokenize-text", b"\x02" + encode("TokenizeRequest", tok, "gateway.proto"))
    tok = 'chunks { kind: CHUNK_KIND_SYSTEM text: "sys" } add_generation_prompt: true'
    write("gateway_request_fuzz", "tokenize-chunks", b"\x02" + encode("TokenizeRequest", tok, "gateway.proto"))
    reg = 'chunks { kind: CHUNK_KIND_SYSTEM text: "shared system prompt" } pin_ttl_seconds: 60'
    write("gateway_request_fuzz", "register", b"\x03" + encode("RegisterChunkRequest", reg, "gateway.proto"))


def tokenizer():
    texts = ["Hello, world!", "caf\u00e9 cafe\u0301 \u4f60\u597d \U0001F600",
             "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>", "  \t\n\n  x  123456789 ",
             "<|im_end|>\u0338 e\u0301\u0323"]
    for i, t in enumerate(texts):
        write("tokenizer_fuzz", "text-%d" % i, b"\x00" + t.encode())
    ids = [[9707, 11, 1879, 0], [151644, 872, 198, 151645, 151667], [99, 100, 101, 102, 151936, 151700]]
    for i, l in enumerate(ids):
        packed = b"".join(struct.pack("<I", x) for x in l)
        write("tokenizer_fuzz", "decode-%d" % i, b"\x01" + packed)
        write("tokenizer_fuzz", "stream-%d" % i, b"\x02" + packed)


def safetensors(tensors):
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    import json
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def model():
    cfg = ('{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 8, '
           '"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1, '
           '"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, '
           '"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true, '
           '"max_position_embeddings": 64, "eos_token_id": [1, 2], "bos_token_id": 0, '
           '"torch_dtype": "bfloat16"}')
    write("model_loader_fuzz", "config-qwen3", b"\x00" + cfg.encode())
    llama = ('{"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, '
             '"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, '
             '"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, '
             '"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, '
             '"max_position_embeddings": 128, "eos_token_id": 3}')
    write("model_loader_fuzz", "config-llama", b"\x00" + llama.encode())
    st = safetensors([("a", "F32", [2, 2], b"\x00\x00\x80\x3f" * 4),
                      ("b", "BF16", [3], b"\x80\x3f" * 3), ("c", "F16", [], b"\x00\x3c")])
    write("model_loader_fuzz", "safetensors", b"\x01" + st)
    # A whole (tiny) Qwen3 model: every tensor ExpectedTensors() names, bf16 zeros.
    shapes = [("model.embed_tokens.weight", [8, 4]), ("model.norm.weight", [4])]
    p = "model.layers.0."
    shapes += [(p + "input_layernorm.weight", [4]), (p + "self_attn.q_proj.weight", [4, 4]),
               (p + "self_attn.k_proj.weight", [2, 4]), (p + "self_attn.v_proj.weight", [2, 4]),
               (p + "self_attn.o_proj.weight", [4, 4]), (p + "self_attn.q_norm.weight", [2]),
               (p + "self_attn.k_norm.weight", [2]), (p + "post_attention_layernorm.weight", [4]),
               (p + "mlp.gate_proj.weight", [8, 4]), (p + "mlp.up_proj.weight", [8, 4]),
               (p + "mlp.down_proj.weight", [4, 8])]
    tensors = []
    for name, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        tensors.append((name, "BF16", shape, b"\x00\x00" * n))
    st = safetensors(tensors)
    write("model_loader_fuzz", "model-dir", b"\x02" + struct.pack("<H", len(cfg)) + cfg.encode() + st)


def registry():
    def rec(op, data):
        return bytes([op]) + struct.pack("<H", len(data)) + data

    h = lambda i: "%032x" % (0x1111 * (i + 1))
    reg = 'worker_id: "w1" address: "127.0.0.1:1" model: "m" block_size: 16 kv_capacity_blocks: 100'
    reg2 = reg.replace('"w1"', '"w2"')
    ev = 'worker_id: "w1" seq: 1 ' + " ".join(
        'events { type: TYPE_STORED chunk { hash: "%s" start: %d end: %d held_tokens: %d parent_hash: "%s" kind: CHUNK_KIND_SYSTEM } }'
        % (h(i), 16 * i, 16 * i + 16, 16 * i + 16, h(i - 1) if i else "") for i in range(4))
    ev2 = 'worker_id: "w1" seq: 2 events { type: TYPE_EVICTED chunk { hash: "%s" } }' % h(3)
    resync = 'worker_id: "w2" seq: 5 chunks { hash: "%s" start: 0 end: 16 held_tokens: 16 kind: CHUNK_KIND_RAW }' % h(0)
    resolve = 'model: "m" chunks { kind: CHUNK_KIND_SYSTEM token_ids: 1 token_ids: 2 } chunks { kind: CHUNK_KIND_QUERY token_ids: 3 cache_salt: "t" }'
    hb = 'worker_id: "w1" load { running: 1 waiting: 2 free_kv_blocks: 3 total_kv_blocks: 4 }'
    seq = (rec(3, encode("RegisterWorkerRequest", reg, "registry.proto")) +
           rec(3, encode("RegisterWorkerRequest", reg2, "registry.proto")) +
           rec(0, encode("ReportEventsRequest", ev, "registry.proto")) +
           rec(0, encode("ReportEventsRequest", ev2, "registry.proto")) +
           rec(1, encode("ResyncRequest", resync, "registry.proto")) +
           rec(2, encode("ResolveRequest", resolve, "registry.proto")) +
           rec(4, encode("HeartbeatRequest", hb, "registry.proto")) +
           rec(6, b"\x01") + rec(6, b"") + rec(5, b"\x00" * 50) + rec(7, b"w2"))
    write("registry_events_fuzz", "session", seq)
    gap = ev.replace("seq: 1", "seq: 3")
    write("registry_events_fuzz", "gap", rec(3, encode("RegisterWorkerRequest", reg, "registry.proto")) +
          rec(0, encode("ReportEventsRequest", gap, "registry.proto")) +
          rec(1, encode("ResyncRequest", resync.replace('"w2"', '"w1"'), "registry.proto")))


def openai():
    # Byte 0: the route (even: /v1/completions, odd: /v1/chat/completions); then the JSON body.
    bodies = {
        "completions": (0, {"prompt": "Once upon a time", "max_tokens": 8, "n": 2, "seed": 3,
                            "logprobs": 2, "stream": True}),
        "chat": (1, {"model": "qwen3", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "a document", "chunk_kind": "context", "cache_salt": "t"},
            {"role": "user", "content": "why?"}],
            "max_completion_tokens": 5, "temperature": 0.7, "top_p": 0.9, "n": 3,
            "logprobs": True, "top_logprobs": 2, "stop": ["\n"]}),
        "chat-stream-bad-n": (1, {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}]}], "stream": True,
            "stream_options": {"include_usage": True}, "n": 17}),
        "prompt-list": (0, {"prompt": ["a", "bb", [5, 6]], "n": 2, "seed": 10, "echo": False,
                            "stream": True, "stream_options": {"include_usage": True}}),
        "chunks": (0, {"chunks": [{"kind": "system", "text": "s"},
                                  {"kind": "query", "token_ids": [1, 2, 3]}], "max_tokens": 2}),
        "logit-bias": (1, {"messages": [{"role": "user", "content": "hi"}],
                           "logit_bias": {"9707": -100, "11": 2.5, "151935": 100},
                           "frequency_penalty": 0.5, "presence_penalty": -0.25}),
    }
    for name, (route, body) in bodies.items():
        write("openai_request_fuzz", name, bytes([route]) + json.dumps(body).encode())


if __name__ == "__main__":
    openai()
    gateway()
    tokenizer()
    model()
    registry()
