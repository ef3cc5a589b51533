#!/usr/bin/env node
// Validates Kubernetes objects against the API's OpenAPI schemas, with the npm package
// kubernetes-models (installed into scripts/node by scripts/setup.sh): each object's class is
// looked up by apiVersion and kind, and its validate() checks types, required fields, enums and
// unknown fields. deploy/check_manifests.py runs it on every kustomize rendering.
//
//   node deploy/validate_schemas.mjs FILE.json [NODE_MODULES_PARENT]
// FILE.json: {"source": [objects...], ...}. Exit 0: all valid; 1: problems (listed); 2: usage or
// the package is missing.
import {readFileSync} from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';
import {pathToFileURL, fileURLToPath} from 'node:url';

const [file, nodeDir = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'scripts',
                                  'node')] = process.argv.slice(2);
if (!file) {
  console.error('usage: validate_schemas.mjs FILE.json [NODE_DIR]');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeDir), 'package.json'));
let root;
try {
  root = path.dirname(require.resolve('kubernetes-models/package.json'));
} catch {
  console.error(`validate_schemas: the npm package kubernetes-models is missing from ${nodeDir}/` +
                'node_modules; run scripts/setup.sh');
  process.exit(2);
}

// "apps/v1" -> apps/v1, "v1" -> v1 (the core group), as the package lays its modules out.
async function classFor(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || typeof kind !== 'string' || !/^[A-Za-z]+$/.test(kind)) {
    return null;
  }
  const modulePath = path.join(root, ...apiVersion.split('/'), `${kind}.js`);
  try {
    const mod = await import(pathToFileURL(modulePath).href);
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

const input = JSON.parse(readFileSync(file, 'utf8'));
let problems = 0;
let checked = 0;
for (const [source, objects] of Object.entries(input)) {
  for (const obj of objects) {
    const where = `${source}: ${obj.kind}/${obj.metadata?.name ?? '?'}`;
    const Kind = await classFor(obj.apiVersion, obj.kind);
    if (Kind === null) {
      console.log(`PROBLEM: ${where}: no schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`);
      problems++;
      continue;
    }
    try {
      new Kind(obj).validate();
      checked++;
    } catch (e) {
      const details = (e.errors ?? []).map((d) => `${d.instancePath || '/'} ${d.message}` +
          (d.params?.additionalProperty ? ` (${d.params.additionalProperty})` : ''));
      console.log(`PROBLEM: ${where}: ${details.length ? details.join('; ') : e.message}`);
      problems++;
    }
  }
}
console.log(`validate_schemas: ${checked} objects valid, ${problems} problems`);
process.exit(problems ? 1 : 0);
