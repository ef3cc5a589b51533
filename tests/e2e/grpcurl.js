#!/usr/bin/env node
// A small stand-in for grpcurl (no grpcurl binary exists for Debian bookworm), for the subset of
// its command line that Cascade documents:
//
//   node tests/e2e/grpcurl.js [-plaintext] [-H 'k: v']... [-d JSON|@] [-max-time SECS]
//                             [-cacert F] [-cert F -key F] [-servername NAME]
//                             [-emit-defaults] HOST:PORT  list [SERVICE]
//                                                       | describe [SYMBOL]
//                                                       | SERVICE/METHOD
//
// Like grpcurl it knows nothing about the server's API in advance: every type comes from the
// server's reflection service (grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo,
// a bidi stream): list_services, then file_containing_symbol and file_by_filename for the
// dependencies. The FileDescriptorProtos are turned into protobuf.js types, the -d JSON is read
// as proto3 JSON (field names as written in the .proto or lowerCamelCase, enum value names,
// 64-bit integers as strings or numbers), and each response is printed as proto3 JSON the way
// grpcurl prints it (lowerCamelCase names, enum names, 64-bit integers as strings, fields at
// their default value left out unless -emit-defaults). Unary and server-streaming methods only.
//
// Exit status as grpcurl's: 0 on success, 1 for a usage or client-side error, 64 + the gRPC
// status code when the RPC fails (so INVALID_ARGUMENT is 67). Failures print like grpcurl:
//   ERROR:
//     Code: InvalidArgument
//     Message: ...
'use strict';

const fs = require('fs');
const path = require('path');
const {createRequire} = require('module');

// --- the npm packages, from scripts/node/node_modules (installed by scripts/setup.sh) ---------

function loadPackages() {
  const repoRoot = path.resolve(__dirname, '..', '..');
  const nodeDir = process.env.CASCADE_NODE_DIR || path.join(repoRoot, 'scripts', 'node');
  const req = createRequire(path.join(nodeDir, 'package.json'));
  try {
    return {
      grpc: req('@grpc/grpc-js'),
      protobuf: req('protobufjs'),
      descriptor: req('protobufjs/ext/descriptor'),
    };
  } catch (e) {
    process.stderr.write(
        `grpcurl.js: cannot load @grpc/grpc-js / protobufjs from ${nodeDir}/node_modules ` +
        `(${e.message.split('\n')[0]}).\nRun scripts/setup.sh to install the npm packages.\n`);
    process.exit(1);
  }
}

const {grpc, protobuf, descriptor} = loadPackages();

// A closed pipe (`... | head`) ends the output quietly, as it does for grpcurl.
process.stdout.on('error', (e) => {
  if (e.code === 'EPIPE') process.exit(0);
  throw e;
});

// protobuf.js's descriptor.proto lacks FieldDescriptorProto.proto3_optional (field 17); add it so
// `describe` can print `optional` fields (adding a field rebuilds the type's generated codec).
if (!descriptor.FieldDescriptorProto.fields.proto3Optional) {
  descriptor.FieldDescriptorProto.add(new protobuf.Field('proto3Optional', 17, 'bool'));
}

// --- the reflection service's own messages (grpc/reflection/v1alpha/reflection.proto) -------

const reflectionRoot = protobuf.Root.fromJSON({
  nested: {
    grpc: {nested: {reflection: {nested: {v1alpha: {nested: {
      ServerReflectionRequest: {
        oneofs: {
          messageRequest: {
            oneof: ['fileByFilename', 'fileContainingSymbol', 'fileContainingExtension',
                    'allExtensionNumbersOfType', 'listServices'],
          },
        },
        fields: {
          host: {type: 'string', id: 1},
          fileByFilename: {type: 'string', id: 3},
          fileContainingSymbol: {type: 'string', id: 4},
          fileContainingExtension: {type: 'ExtensionRequest', id: 5},
          allExtensionNumbersOfType: {type: 'string', id: 6},
          listServices: {type: 'string', id: 7},
        },
      },
      ExtensionRequest: {
        fields: {
          containingType: {type: 'string', id: 1},
          extensionNumber: {type: 'int32', id: 2},
        },
      },
      ServerReflectionResponse: {
        oneofs: {
          messageResponse: {
            oneof: ['fileDescriptorResponse', 'allExtensionNumbersResponse',
                    'listServicesResponse', 'errorResponse'],
          },
        },
        fields: {
          validHost: {type: 'string', id: 1},
          originalRequest: {type: 'ServerReflectionRequest', id: 2},
          fileDescriptorResponse: {type: 'FileDescriptorResponse', id: 4},
          allExtensionNumbersResponse: {type: 'ExtensionNumberResponse', id: 5},
          listServicesResponse: {type: 'ListServiceResponse', id: 6},
          errorResponse: {type: 'ErrorResponse', id: 7},
        },
      },
      FileDescriptorResponse: {fields: {fileDescriptorProto: {rule: 'repeated', type: 'bytes', id: 1}}},
      ExtensionNumberResponse: {
        fields: {
          baseTypeName: {type: 'string', id: 1},
          extensionNumber: {rule: 'repeated', type: 'int32', id: 2},
        },
      },
      ListServiceResponse: {fields: {service: {rule: 'repeated', type: 'ServiceResponse', id: 1}}},
      ServiceResponse: {fields: {name: {type: 'string', id: 1}}},
      ErrorResponse: {
        fields: {
          errorCode: {type: 'int32', id: 1},
          errorMessage: {type: 'string', id: 2},
        },
      },
    }}}}}},
  },
});
const ReflectionRequest = reflectionRoot.lookupType('grpc.reflection.v1alpha.ServerReflectionRequest');
const ReflectionResponse = reflectionRoot.lookupType('grpc.reflection.v1alpha.ServerReflectionResponse');
const REFLECTION_METHOD = '/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo';

// --- errors and usage -------------------------------------------------------------------------

class UsageError extends Error {}

const USAGE = `Usage: node tests/e2e/grpcurl.js [flags] HOST:PORT list [SERVICE]
       node tests/e2e/grpcurl.js [flags] HOST:PORT describe [SYMBOL]
       node tests/e2e/grpcurl.js [flags] HOST:PORT SERVICE/METHOD
Flags:
  -plaintext        no TLS (without it: TLS with the system's root certificates)
  -cacert FILE      PEM roots to verify the server with, instead of the system's
  -cert FILE        PEM client certificate (mutual TLS; with -key)
  -key FILE         PEM key of -cert
  -servername NAME  name expected in the server's certificate, if not the address' host
  -H 'name: value'  request metadata, for reflection and the call (repeatable)
  -d JSON           request in proto3 JSON; '@' reads it from stdin; absent: an empty message
  -max-time SECS    deadline of the whole operation
  -emit-defaults    print fields at their default values too
`;

function parseArgs(argv) {
  const opts = {plaintext: false, headers: [], data: null, maxTime: 0, emitDefaults: false,
    cacert: null, cert: null, key: null, servername: null};
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    if (!a.startsWith('-') || a === '-') {
      rest.push(a);
      continue;
    }
    a = a.replace(/^--?/, '-');
    let inline = null;
    const eq = a.indexOf('=');
    if (eq > 0) {
      inline = a.slice(eq + 1);
      a = a.slice(0, eq);
    }
    const value = () => {
      if (inline !== null) return inline;
      if (i + 1 >= argv.length) throw new UsageError(`flag ${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '-plaintext': opts.plaintext = inline === null || inline === 'true'; break;
      case '-H': case '-rpc-header': case '-reflect-header': opts.headers.push(value()); break;
      case '-d': opts.data = value(); break;
      case '-max-time': opts.maxTime = Number(value()); break;
      case '-cacert': opts.cacert = value(); break;
      case '-cert': opts.cert = value(); break;
      case '-key': opts.key = value(); break;
      case '-servername': opts.servername = value(); break;
      case '-emit-defaults': opts.emitDefaults = inline === null || inline === 'true'; break;
      case '-h': case '-help': process.stdout.write(USAGE); process.exit(0); break;
      default: throw new UsageError(`unknown flag ${a}`);
    }
  }
  if (rest.length < 2) throw new UsageError('too few arguments');
  if ((opts.cert === null) !== (opts.key === null)) throw new UsageError('-cert and -key go together');
  opts.address = rest[0];
  opts.verb = rest[1];
  opts.args = rest.slice(2);
  return opts;
}

function makeMetadata(headers) {
  const md = new grpc.Metadata();
  for (const h of headers) {
    const colon = h.indexOf(':');
    if (colon <= 0) throw new UsageError(`header '${h}' is not 'name: value'`);
    md.add(h.slice(0, colon).trim().toLowerCase(), h.slice(colon + 1).trim());
  }
  return md;
}

// grpcurl prints codes in Go's spelling.
const CODE_NAMES = ['OK', 'Canceled', 'Unknown', 'InvalidArgument', 'DeadlineExceeded', 'NotFound',
  'AlreadyExists', 'PermissionDenied', 'ResourceExhausted', 'FailedPrecondition', 'Aborted',
  'OutOfRange', 'Unimplemented', 'Internal', 'Unavailable', 'DataLoss', 'Unauthenticated'];

class RpcError extends Error {
  constructor(status) {
    super(status.details);
    this.status = status;
  }
}

// --- reflection client ------------------------------------------------------------------------

class Reflection {
  constructor(client, metadata, deadline) {
    this.pending = [];
    this.failure = null;
    this.call = client.makeBidiStreamRequest(
        REFLECTION_METHOD,
        (msg) => Buffer.from(ReflectionRequest.encode(ReflectionRequest.fromObject(msg)).finish()),
        (buf) => ReflectionResponse.decode(buf),
        metadata, {deadline});
    this.call.on('data', (resp) => {
      const p = this.pending.shift();
      if (p) p.resolve(resp);
    });
    this.call.on('error', (err) => this.fail(err));
    this.call.on('end', () => this.fail(Object.assign(new Error('reflection stream ended'),
                                                    {code: grpc.status.UNKNOWN})));
    this.call.on('status', () => {});
  }

  fail(err) {
    this.failure = this.failure || err;
    for (const p of this.pending.splice(0)) p.reject(this.failure);
  }

  // One request, one response (the server answers in order).
  ask(req) {
    if (this.failure) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => {
      this.pending.push({resolve, reject});
      this.call.write(req);
    }).then((resp) => {
      if (resp.errorResponse) {
        throw new RpcError({code: resp.errorResponse.errorCode,
                            details: resp.errorResponse.errorMessage});
      }
      return resp;
    });
  }

  close() {
    this.call.end();
  }

  async listServices() {
    const resp = await this.ask({listServices: '*'});
    return (resp.listServicesResponse ? resp.listServicesResponse.service : []).map((s) => s.name);
  }
}

// The file descriptors the server knows, fetched on demand with their dependencies.
class DescriptorPool {
  constructor(reflection) {
    this.reflection = reflection;
    this.files = new Map();  // name -> decoded FileDescriptorProto
    this.root = null;
  }

  async addFromResponse(resp) {
    const fdr = resp.fileDescriptorResponse;
    if (!fdr) throw new Error('reflection: no file descriptors in the answer');
    const added = [];
    for (const bytes of fdr.fileDescriptorProto) {
      const file = descriptor.FileDescriptorProto.decode(bytes);
      if (!this.files.has(file.name)) {
        this.files.set(file.name, file);
        added.push(file);
      }
    }
    for (const file of added) {
      for (const dep of file.dependency || []) {
        if (!this.files.has(dep)) {
          await this.addFromResponse(await this.reflection.ask({fileByFilename: dep}));
        }
      }
    }
    this.root = null;
  }

  async loadSymbol(symbol) {
    try {
      await this.addFromResponse(await this.reflection.ask({fileContainingSymbol: symbol}));
    } catch (e) {
      if (e instanceof RpcError) {
        throw new Error(`Symbol "${symbol}" not found: ${e.message}`);
      }
      throw e;
    }
  }

  // protobuf.js types for everything fetched so far.
  protoRoot() {
    if (!this.root) {
      this.root = protobuf.Root.fromDescriptor({file: [...this.files.values()]});
    }
    return this.root;
  }

  // Finds a symbol's descriptor: {kind, proto, fullName, file} or null.
  find(fullName) {
    const target = fullName.replace(/^\./, '');
    for (const file of this.files.values()) {
      const pkg = file.package ? file.package + '.' : '';
      for (const svc of file.service || []) {
        if (pkg + svc.name === target) return {kind: 'service', proto: svc, fullName: target, file};
        for (const m of svc.method || []) {
          if (`${pkg}${svc.name}.${m.name}` === target) {
            return {kind: 'method', proto: m, fullName: target, file};
          }
        }
      }
      const walk = (prefix, messages, enums) => {
        for (const e of enums || []) {
          if (prefix + e.name === target) return {kind: 'enum', proto: e, fullName: target, file};
        }
        for (const m of messages || []) {
          if (prefix + m.name === target) return {kind: 'message', proto: m, fullName: target, file};
          const inner = walk(`${prefix}${m.name}.`, m.nestedType, m.enumType);
          if (inner) return inner;
        }
        return null;
      };
      const found = walk(pkg, file.messageType, file.enumType);
      if (found) return found;
    }
    return null;
  }

  isMapEntry(fullName) {
    const d = this.find(fullName);
    return !!(d && d.kind === 'message' && d.proto.options && d.proto.options.mapEntry);
  }
}

// --- proto3 JSON ------------------------------------------------------------------------------

function jsonName(name) {
  return name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase()).replace(/_/g, '');
}

const INT64_TYPES = new Set(['int64', 'uint64', 'sint64', 'fixed64', 'sfixed64']);
const INT32_TYPES = new Set(['int32', 'uint32', 'sint32', 'fixed32', 'sfixed32']);

function fieldLabel(type, field) {
  return `${type.fullName.replace(/^\./, '')}.${field.name}`;
}

// proto3 JSON value -> the plain object protobuf.js's fromObject takes (keys = proto field names).
function jsonToObject(type, json, pool) {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw new Error(`message type ${type.fullName.replace(/^\./, '')} needs a JSON object`);
  }
  const out = {};
  const seenOneof = new Map();
  for (const [key, value] of Object.entries(json)) {
    const field = type.fields[key] ||
        type.fieldsArray.find((f) => jsonName(f.name) === key);
    if (!field) {
      throw new Error(`message type ${type.fullName.replace(/^\./, '')} has no known field named ${key}`);
    }
    if (value === null) continue;
    if (field.partOf && field.partOf.fieldsArray.length > 1) {
      const other = seenOneof.get(field.partOf.name);
      if (other) throw new Error(`oneof ${field.partOf.name} has both ${other} and ${field.name}`);
      seenOneof.set(field.partOf.name, field.name);
    }
    field.resolve();
    const rt = field.resolvedType;
    if (rt instanceof protobuf.Type && pool.isMapEntry(rt.fullName)) {
      if (typeof value !== 'object' || Array.isArray(value)) {
        throw new Error(`field ${fieldLabel(type, field)} needs a JSON object (map)`);
      }
      const keyField = rt.fields.key;
      const valueField = rt.fields.value;
      out[field.name] = Object.entries(value).map(([k, v]) => ({
        key: scalarFromJson(rt, keyField, k, pool),
        value: valueFromJson(rt, valueField, v, pool),
      }));
    } else if (field.repeated) {
      if (!Array.isArray(value)) throw new Error(`field ${fieldLabel(type, field)} needs a JSON array`);
      out[field.name] = value.map((v) => valueFromJson(type, field, v, pool));
    } else {
      out[field.name] = valueFromJson(type, field, value, pool);
    }
  }
  return out;
}

function valueFromJson(type, field, value, pool) {
  const rt = field.resolvedType;
  if (rt instanceof protobuf.Type) return jsonToObject(rt, value, pool);
  return scalarFromJson(type, field, value, pool);
}

function scalarFromJson(type, field, value) {
  field.resolve();
  const rt = field.resolvedType;
  const where = fieldLabel(type, field);
  if (rt instanceof protobuf.Enum) {
    if (typeof value === 'string') {
      if (!(value in rt.values)) {
        throw new Error(`enum ${rt.fullName.replace(/^\./, '')} has no value named ${value} (field ${where})`);
      }
      return rt.values[value];
    }
    if (Number.isInteger(value)) return value;
    throw new Error(`field ${where} needs an enum name or number`);
  }
  const t = field.type;
  if (t === 'string') {
    if (typeof value !== 'string') throw new Error(`field ${where} needs a string`);
    return value;
  }
  if (t === 'bool') {
    if (typeof value === 'boolean') return value;
    if (value === 'true' || value === 'false') return value === 'true';
    throw new Error(`field ${where} needs true or false`);
  }
  if (t === 'bytes') {
    if (typeof value !== 'string') throw new Error(`field ${where} needs base64 text`);
    return Buffer.from(value.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
  }
  if (t === 'float' || t === 'double') {
    if (typeof value === 'number') return value;
    if (value === 'NaN') return NaN;
    if (value === 'Infinity') return Infinity;
    if (value === '-Infinity') return -Infinity;
    if (typeof value === 'string' && value.trim() !== '' && !isNaN(Number(value))) return Number(value);
    throw new Error(`field ${where} needs a number`);
  }
  if (INT32_TYPES.has(t) || INT64_TYPES.has(t)) {
    const text = typeof value === 'number' ? String(value) : value;
    if (typeof text !== 'string' || !/^-?\d+(\.0*)?$|^-?\d+(\.\d+)?[eE]\+?\d+$/.test(text.trim())) {
      throw new Error(`field ${where} needs an integer`);
    }
    if (INT32_TYPES.has(t)) {
      const n = Number(text);
      if (!Number.isInteger(n)) throw new Error(`field ${where} needs an integer`);
      return n;
    }
    return /[.eE]/.test(text) ? String(BigInt(Number(text))) : text.trim();  // fromObject reads decimal strings
  }
  throw new Error(`field ${where}: unsupported type ${t}`);
}

// The shortest decimal that reads back as the same float32 (Go's jsonpb prints floats this way).
function float32Text(x) {
  for (let p = 1; p <= 9; p++) {
    const s = Number(x.toPrecision(p));
    if (Math.fround(s) === x) return s;
  }
  return x;
}

function scalarToJson(field, value) {
  const rt = field.resolvedType;
  if (rt instanceof protobuf.Enum) {
    return rt.valuesById[value] !== undefined ? rt.valuesById[value] : value;
  }
  const t = field.type;
  if (INT64_TYPES.has(t)) return String(value);  // a Long or a number
  if (t === 'bytes') return Buffer.from(value).toString('base64');
  if (t === 'float' || t === 'double') {
    if (Number.isNaN(value)) return 'NaN';
    if (value === Infinity) return 'Infinity';
    if (value === -Infinity) return '-Infinity';
    return t === 'float' ? float32Text(value) : value;
  }
  return value;
}

function isDefaultScalar(field, value) {
  if (value === null || value === undefined) return true;
  if (INT64_TYPES.has(field.type)) return String(value) === '0';
  if (field.type === 'bytes') return value.length === 0;
  return value === 0 || value === '' || value === false;
}

function defaultJson(field, pool) {
  if (field.repeated) return field.resolvedType && pool.isMapEntry(field.resolvedType.fullName) ? {} : [];
  if (field.resolvedType instanceof protobuf.Type) return null;
  if (field.resolvedType instanceof protobuf.Enum) return scalarToJson(field, 0);
  if (INT64_TYPES.has(field.type)) return '0';
  return {string: '', bool: false, bytes: ''}[field.type] !== undefined ?
      {string: '', bool: false, bytes: ''}[field.type] : 0;
}

// A decoded protobuf.js message -> proto3 JSON, as grpcurl prints it.
function messageToJson(type, msg, pool, emitDefaults) {
  const out = {};
  for (const field of type.fieldsArray) {
    field.resolve();
    const rt = field.resolvedType;
    const present = Object.prototype.hasOwnProperty.call(msg, field.name) && msg[field.name] != null;
    const key = jsonName(field.name);
    if (!present) {
      if (emitDefaults && !field.partOf) {
        const d = defaultJson(field, pool);
        if (d !== null) out[key] = d;
      }
      continue;
    }
    const value = msg[field.name];
    if (field.repeated) {
      if (value.length === 0 && !emitDefaults) continue;
      if (rt instanceof protobuf.Type && pool.isMapEntry(rt.fullName)) {
        const obj = {};
        for (const e of value) {
          obj[String(scalarToJson(rt.fields.key, e.key))] =
              rt.fields.value.resolve().resolvedType instanceof protobuf.Type ?
                  messageToJson(rt.fields.value.resolvedType, e.value || {}, pool, emitDefaults) :
                  scalarToJson(rt.fields.value, e.value);
        }
        out[key] = obj;
      } else {
        out[key] = value.map((v) => rt instanceof protobuf.Type ?
            messageToJson(rt, v, pool, emitDefaults) : scalarToJson(field, v));
      }
      continue;
    }
    if (rt instanceof protobuf.Type) {
      out[key] = messageToJson(rt, value, pool, emitDefaults);
      continue;
    }
    // Scalars without presence (not in a oneof, not proto3 `optional`) are omitted at default.
    if (!field.partOf && !emitDefaults && isDefaultScalar(field, value)) continue;
    out[key] = scalarToJson(field, value);
  }
  return out;
}

// --- describe (grpcurl's layout: fully qualified type names, elements sorted) -----------------

const TYPE_NAMES = {1: 'double', 2: 'float', 3: 'int64', 4: 'uint64', 5: 'int32', 6: 'fixed64',
  7: 'fixed32', 8: 'bool', 9: 'string', 12: 'bytes', 13: 'uint32', 15: 'sfixed32',
  16: 'sfixed64', 17: 'sint32', 18: 'sint64'};

function fieldTypeText(f) {
  return f.typeName ? f.typeName : TYPE_NAMES[f.type] || `type${f.type}`;
}

function describeMessage(msg, indent, pool, prefix) {
  const pad = ' '.repeat(indent);
  const lines = [`${pad}message ${msg.name} {`];
  const fields = msg.field || [];
  // Decoded messages keep defaults on the prototype: only an own oneofIndex was on the wire.
  const inOneof = (f) => Object.prototype.hasOwnProperty.call(f, 'oneofIndex');
  const realOneofs = new Set();
  fields.forEach((f) => {
    if (inOneof(f) && !f.proto3Optional) realOneofs.add(f.oneofIndex);
  });
  const printed = new Set();
  const fieldLine = (f, p) => {
    let label = '';
    if (f.label === 3) label = 'repeated ';
    else if (f.label === 2) label = 'required ';
    else if (f.proto3Optional) label = 'optional ';
    let typeText = fieldTypeText(f);
    const entry = f.label === 3 && f.typeName && pool.isMapEntry(f.typeName) ? pool.find(f.typeName).proto : null;
    if (entry) {
      const [k, v] = entry.field;
      label = '';
      typeText = `map<${fieldTypeText(k)}, ${fieldTypeText(v)}>`;
    }
    return `${p}${label}${typeText} ${f.name} = ${f.number};`;
  };
  for (const f of [...fields].sort((a, b) => a.number - b.number)) {
    if (printed.has(f)) continue;
    if (inOneof(f) && realOneofs.has(f.oneofIndex)) {
      const members = fields.filter((g) => inOneof(g) && g.oneofIndex === f.oneofIndex);
      lines.push(`${pad}  oneof ${msg.oneofDecl[f.oneofIndex].name} {`);
      for (const g of members.sort((a, b) => a.number - b.number)) {
        lines.push(fieldLine(g, pad + '    '));
        printed.add(g);
      }
      lines.push(`${pad}  }`);
    } else {
      lines.push(fieldLine(f, pad + '  '));
      printed.add(f);
    }
  }
  for (const n of [...(msg.nestedType || [])].sort((a, b) => a.name.localeCompare(b.name))) {
    if (n.options && n.options.mapEntry) continue;
    lines.push(describeMessage(n, indent + 2, pool, `${prefix}${msg.name}.`));
  }
  for (const e of [...(msg.enumType || [])].sort((a, b) => a.name.localeCompare(b.name))) {
    lines.push(describeEnum(e, indent + 2));
  }
  lines.push(`${pad}}`);
  return lines.join('\n');
}

function describeEnum(e, indent) {
  const pad = ' '.repeat(indent);
  const lines = [`${pad}enum ${e.name} {`];
  for (const v of [...(e.value || [])].sort((a, b) => a.number - b.number)) {
    lines.push(`${pad}  ${v.name} = ${v.number};`);
  }
  lines.push(`${pad}}`);
  return lines.join('\n');
}

function methodLine(m, pad) {
  return `${pad}rpc ${m.name} ( ${m.clientStreaming ? 'stream ' : ''}${m.inputType} ) returns ` +
      `( ${m.serverStreaming ? 'stream ' : ''}${m.outputType} );`;
}

function describe(d, pool) {
  switch (d.kind) {
    case 'service': {
      const lines = [`${d.fullName} is a service:`, `service ${d.proto.name} {`];
      for (const m of [...(d.proto.method || [])].sort((a, b) => a.name.localeCompare(b.name))) {
        lines.push(methodLine(m, '  '));
      }
      lines.push('}');
      return lines.join('\n');
    }
    case 'method':
      return `${d.fullName} is a method:\n${methodLine(d.proto, '')}`;
    case 'message':
      return `${d.fullName} is a message:\n${describeMessage(d.proto, 0, pool, '')}`;
    case 'enum':
      return `${d.fullName} is an enum:\n${describeEnum(d.proto, 0)}`;
    default:
      throw new Error(`cannot describe ${d.fullName}`);
  }
}

// --- the commands -----------------------------------------------------------------------------

function splitMethod(name) {
  const n = name.replace(/^\./, '');
  const slash = n.lastIndexOf('/');
  const cut = slash >= 0 ? slash : n.lastIndexOf('.');
  if (cut <= 0) throw new UsageError(`"${name}" is not SERVICE/METHOD`);
  return {service: n.slice(0, cut), method: n.slice(cut + 1)};
}

async function readData(data) {
  if (data === null) return {};
  let text = data;
  if (data === '@') text = fs.readFileSync(0, 'utf8');
  try {
    return text.trim() === '' ? {} : JSON.parse(text);
  } catch (e) {
    throw new Error(`-d is not valid JSON: ${e.message}`);
  }
}

async function invoke(client, pool, opts, metadata, deadline) {
  const {service, method} = splitMethod(opts.verb);
  await pool.loadSymbol(service);
  const root = pool.protoRoot();
  let svc;
  try {
    svc = root.lookupService(service);
  } catch (e) {
    throw new Error(`Symbol "${service}" is not a service`);
  }
  const m = svc.methods[method];
  if (!m) throw new Error(`service "${service}" does not include a method named "${method}"`);
  m.resolve();
  if (m.requestStream) throw new Error(`${service}/${method} is a client- or bidi-streaming method; not supported`);
  const reqType = m.resolvedRequestType;
  const respType = m.resolvedResponseType;
  const json = await readData(opts.data);
  const plain = jsonToObject(reqType, json, pool);
  const request = reqType.fromObject(plain);
  const err = reqType.verify(request);
  if (err) throw new Error(`request does not verify: ${err}`);
  const rpcPath = `/${service}/${method}`;
  const serialize = (msg) => Buffer.from(reqType.encode(msg).finish());
  const deserialize = (buf) => respType.decode(buf);
  const print = (resp) => {
    process.stdout.write(JSON.stringify(messageToJson(respType, resp, pool, opts.emitDefaults), null, 2) + '\n');
  };
  const options = deadline ? {deadline} : {};
  await new Promise((resolve, reject) => {
    if (m.responseStream) {
      const call = client.makeServerStreamRequest(rpcPath, serialize, deserialize, request, metadata, options);
      call.on('data', print);
      call.on('error', (e) => reject(new RpcError(e)));
      call.on('status', (s) => {
        if (s.code === grpc.status.OK) resolve();
      });
    } else {
      client.makeUnaryRequest(rpcPath, serialize, deserialize, request, metadata, options, (e, resp) => {
        if (e) return reject(new RpcError(e));
        print(resp);
        resolve();
      });
    }
  });
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`${e.message}\n${USAGE}`);
    return 1;
  }
  const metadata = makeMetadata(opts.headers);
  const deadline = opts.maxTime > 0 ? new Date(Date.now() + opts.maxTime * 1000) : undefined;
  const fs = require('fs');
  const read = (f) => (f === null ? null : fs.readFileSync(f));
  const creds = opts.plaintext ? grpc.credentials.createInsecure()
                               : grpc.credentials.createSsl(read(opts.cacert), read(opts.key),
                                                            read(opts.cert));
  const channelOptions = opts.servername === null ? {}
      : {'grpc.ssl_target_name_override': opts.servername, 'grpc.default_authority': opts.servername};
  const Client = grpc.makeGenericClientConstructor({}, 'GrpcurlClient');
  const client = new Client(opts.address, creds, channelOptions);
  const reflection = new Reflection(client, metadata, deadline);
  const pool = new DescriptorPool(reflection);
  try {
    if (opts.verb === 'list') {
      if (opts.args.length === 0) {
        const names = await reflection.listServices();
        process.stdout.write(names.sort().map((n) => n + '\n').join(''));
      } else {
        const service = opts.args[0].replace(/^\./, '');
        await pool.loadSymbol(service);
        const d = pool.find(service);
        if (!d || d.kind !== 'service') throw new Error(`Symbol "${service}" is not a service`);
        const names = (d.proto.method || []).map((m) => `${service}.${m.name}`).sort();
        process.stdout.write(names.map((n) => n + '\n').join(''));
      }
    } else if (opts.verb === 'describe') {
      let symbols = opts.args.map((s) => s.replace(/^\./, ''));
      if (symbols.length === 0) symbols = (await reflection.listServices()).sort();
      const texts = [];
      for (const symbol of symbols) {
        // grpcurl accepts SERVICE/METHOD here as well as SERVICE.METHOD.
        const dotted = symbol.replace('/', '.');
        await pool.loadSymbol(dotted);
        const d = pool.find(dotted);
        if (!d) throw new Error(`Symbol "${symbol}" not found`);
        texts.push(describe(d, pool));
      }
      process.stdout.write(texts.join('\n') + '\n');
    } else {
      await invoke(client, pool, opts, metadata, deadline);
    }
    return 0;
  } catch (e) {
    if (e instanceof RpcError) {
      const code = e.status.code;
      process.stderr.write(`ERROR:\n  Code: ${CODE_NAMES[code] || code}\n  Message: ${e.status.details}\n`);
      return 64 + code;
    }
    if (e && typeof e.code === 'number' && e.details !== undefined) {
      process.stderr.write(`Failed to use reflection: ${CODE_NAMES[e.code] || e.code}: ${e.details}\n`);
      return 1;
    }
    if (e instanceof UsageError) {
      process.stderr.write(`${e.message}\n${USAGE}`);
      return 1;
    }
    process.stderr.write(`Error: ${e.message}\n`);
    return 1;
  } finally {
    reflection.close();
    client.close();
  }
}

main().then((code) => {
  process.exitCode = code;
});
