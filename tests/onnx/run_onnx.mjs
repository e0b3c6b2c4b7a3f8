// Runs an ONNX file with ONNX Runtime's CPU provider (npm onnxruntime-node, installed by
// scripts/setup.sh with --ignore-scripts): node run_onnx.mjs MODEL.onnx INPUTS.safetensors
// OUTPUTS.safetensors. Inputs are matched to the graph's inputs by name; every graph output is
// written. The test suite compares them with the engine's own outputs (test_onnx_export.cpp).
import fs from 'node:fs';
import ort from 'onnxruntime-node';

const [modelPath, inputPath, outputPath] = process.argv.slice(2);
if (!outputPath) {
  console.error('usage: node run_onnx.mjs MODEL.onnx INPUTS.safetensors OUTPUTS.safetensors');
  process.exit(2);
}

const kinds = {
  F32: { type: 'float32', array: Float32Array },
  F16: { type: 'float16', array: Uint16Array },
  I64: { type: 'int64', array: BigInt64Array },
  I32: { type: 'int32', array: Int32Array },
};

function readSafetensors(path) {
  const buf = fs.readFileSync(path);
  const headerLength = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLength).toString('utf8'));
  const base = 8 + headerLength;
  const feeds = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const kind = kinds[info.dtype];
    if (!kind) throw new Error(`${path}: ${name} has dtype ${info.dtype}, not one of ${Object.keys(kinds)}`);
    const [begin, end] = info.data_offsets;
    const bytes = buf.subarray(base + begin, base + end);
    const copy = new Uint8Array(bytes.length);
    copy.set(bytes);
    const data = new kind.array(copy.buffer, 0, bytes.length / kind.array.BYTES_PER_ELEMENT);
    feeds[name] = new ort.Tensor(kind.type, data, info.shape);
  }
  return feeds;
}

function writeSafetensors(path, tensors) {
  const header = {};
  const chunks = [];
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const dtype = Object.keys(kinds).find((k) => kinds[k].type === t.type);
    if (!dtype) throw new Error(`output ${name} has type ${t.type}`);
    const bytes = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[name] = { dtype, shape: t.dims, data_offsets: [offset, offset + bytes.length] };
    chunks.push(bytes);
    offset += bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  const tmp = `${path}.tmp`;
  fs.writeFileSync(tmp, Buffer.concat([length, Buffer.from(json), ...chunks]));
  fs.renameSync(tmp, path);
}

// 'basic' (constant folding, redundant-node removal): the check is of the results; 'all' adds
// layout rewrites that took 4x longer to set up the 3.5 GB UNet than to run it.
const session = await ort.InferenceSession.create(modelPath, {
  executionProviders: ['cpu'],
  graphOptimizationLevel: 'basic',
});
const feeds = readSafetensors(inputPath);
for (const name of session.inputNames)
  if (!(name in feeds)) throw new Error(`${inputPath} has no input named ${name}`);
const results = await session.run(feeds);
writeSafetensors(outputPath, results);
