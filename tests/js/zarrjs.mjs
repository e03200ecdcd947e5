// zarr.js 0.6 (npm `zarr`) reading and writing Zarr v2 arrays in directories: the JavaScript
// client of tests/test_legacy_readers.py. zarr.js has no store for files, so a small one is here.
//
//   node zarrjs.mjs [--zstd] JOBS_JSON
//
// JOBS_JSON is a list of jobs; prints a JSON list of results, one per job:
//   {"op": "read", "array": DIR}
//       -> {"shape", "dtype", "nodata" (fill_value; "NaN" for NaN), "order", "data" (C-order bytes, base64),
//           "native" (the dtype of "data": zarr.js swaps big-endian data to the machine's order)}
//   {"op": "create", "array": DIR, "shape", "chunks", "dtype", "nodata", "compressor", "data"}
//       creates the array and writes every element -> {"ok": true}
// A job zarr.js cannot do (an unknown dtype or codec, a missing file) gives {"error": "..."}.
// zarr.js decodes zlib, gzip and blosc; --zstd registers numcodecs.js's zstd first (zarr.js's
// documented way to add a codec: without it every zstd array fails, on a real v2 copy too).
import { promises as fs } from "node:fs";
import path from "node:path";
import Zstd from "numcodecs/zstd";
import { KeyError, NestedArray, addCodec, create, getTypedArrayCtr, openArray } from "zarr";

/** A zarr.js store over one directory: keys are relative paths, a missing file is a KeyError. */
class DirectoryStore {
  constructor(root) {
    this.root = root;
  }
  async getItem(key) {
    try {
      const buf = await fs.readFile(path.join(this.root, key));
      return buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
    } catch (e) {
      if (e.code === "ENOENT") throw new KeyError(key);
      throw e;
    }
  }
  async setItem(key, value) {
    const file = path.join(this.root, key);
    await fs.mkdir(path.dirname(file), { recursive: true });
    const bytes = typeof value === "string" ? Buffer.from(value) : Buffer.from(new Uint8Array(value));
    await fs.writeFile(file, bytes); // open(O_TRUNC) + write, as FSStore-like writers do
    return true;
  }
  async deleteItem(key) {
    await fs.rm(path.join(this.root, key), { force: true });
    return true;
  }
  async containsItem(key) {
    try {
      await fs.stat(path.join(this.root, key));
      return true;
    } catch {
      return false;
    }
  }
  async keys() {
    return fs.readdir(this.root);
  }
}

function bytesOf(typed) {
  return Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength).toString("base64");
}

function fillJson(value) {
  return typeof value === "number" && !Number.isFinite(value) ? String(value) : value;
}

async function read(job) {
  const arr = await openArray({ store: new DirectoryStore(job.array), mode: "r" });
  const raw = await arr.getRaw(null);
  // zarr.js hands back typed arrays in the machine's (little-endian) byte order whatever the dtype's
  return { shape: arr.shape, dtype: arr.dtype, native: arr.dtype.replace(/^>/, "<"), nodata: fillJson(arr.fillValue),
           order: arr.meta.order, data: bytesOf(raw.data) };
}

async function write(job) {
  const arr = await create({
    store: new DirectoryStore(job.array), shape: job.shape, chunks: job.chunks, dtype: job.dtype,
    fillValue: job.nodata ?? null, compressor: job.compressor ?? null,
  });
  const Ctr = getTypedArrayCtr(job.dtype);
  const buf = Buffer.from(job.data, "base64");
  const data = new Ctr(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
  await arr.set(null, new NestedArray(data, job.shape, job.dtype));
  return { ok: true };
}

// zarr.js looks codecs up in promises it does not await: their failures arrive here and fail
// the job under way.
let failJob = null;
process.on("unhandledRejection", (e) => failJob && failJob(e));
const args = process.argv.slice(2);
if (args[0] === "--zstd") {
  args.shift();
  addCodec(Zstd.codecId, () => Zstd);
}
const results = [];
for (const job of JSON.parse(args[0])) {
  try {
    results.push(await new Promise((resolve, reject) => {
      failJob = reject;
      (job.op === "read" ? read(job) : write(job)).then(resolve, reject);
    }));
  } catch (e) {
    results.push({ error: `${e.name}: ${e.message}` });
  }
}
process.stdout.write(JSON.stringify(results));
