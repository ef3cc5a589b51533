"""Second oracle for parity_test: Hugging Face `tokenizers` itself (installed on the GPU
machine, not in CI). Encodes each JSON-string line of <in.jsonl> and writes one JSON id array
per line to <out.jsonl>. Usage: python3 hf_encode.py <tokenizer.json> <in.jsonl> <out.jsonl>"""
import json
import sys

from tokenizers import Tokenizer


def main() -> None:
    tokenizer_json, input_path, output_path = sys.argv[1:4]
    tokenizer = Tokenizer.from_file(tokenizer_json)
    with open(input_path, encoding="utf-8", newline="\n") as f:
        # Not splitlines(): U+2028 and friends inside a line are text, not line breaks.
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    with open(output_path, "w", encoding="utf-8") as out:
        for line in lines:
            ids = tokenizer.encode(json.loads(line), add_special_tokens=False).ids
            out.write(json.dumps(ids) + "\n")


if __name__ == "__main__":
    main()
