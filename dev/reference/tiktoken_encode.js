// Reference GPT-2 encoder for the tokenizer oracle test and benchmark: encodes files with js-tiktoken's "gpt2"
// encoding, exactly as our prepro_gpt2 is meant to. Files are decoded like any standard UTF-8 reader does
// (WHATWG TextDecoder: invalid bytes become U+FFFD, a leading BOM is kept as U+FEFF), and "<|endoftext|>" in the
// text is encoded as plain text (no special tokens allowed, none disallowed).
//
// usage: node dev/reference/tiktoken_encode.js [--modules DIR] [--eot-before-each] [--out TOKENS.bin]
//            [--offsets OFFSETS.tsv] [--file-list LIST] [--bench] FILE...
//   --modules DIR      node_modules holding js-tiktoken (default: data/cache/node/node_modules)
//   --eot-before-each  put 50256 before each file's tokens, as the shards do
//   --out              all tokens, concatenated, as little-endian uint16
//   --offsets          one line per file: index of its first token in --out, a tab, the file path
//   --bench            print encode-only throughput (excludes loading js-tiktoken and reading files)
'use strict';
const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(`error: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = {
    modules: path.join(__dirname, '..', '..', 'data', 'cache', 'node', 'node_modules'),
    eot: false, out: null, offsets: null, bench: false, files: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${a}: missing value`);
      return argv[++i];
    };
    if (a === '--modules') args.modules = value();
    else if (a === '--eot-before-each') args.eot = true;
    else if (a === '--out') args.out = value();
    else if (a === '--offsets') args.offsets = value();
    else if (a === '--bench') args.bench = true;
    else if (a === '--file-list') {
      const list = value();
      let text;
      try { text = fs.readFileSync(list, 'utf8'); } catch (e) { fail(`${list}: cannot read (${e.code})`); }
      args.files.push(...text.split('\n').filter((l) => l.length > 0));
    } else if (a.startsWith('--')) fail(`unknown flag ${a}`);
    else args.files.push(a);
  }
  if (!args.files.length) fail('no input files');
  return args;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  let tiktoken;
  try {
    tiktoken = require(path.resolve(args.modules, 'js-tiktoken'));
  } catch (e) {
    fail(`cannot load js-tiktoken from ${args.modules} (run data/prepare_default.sh)`);
  }
  const encoding = tiktoken.getEncoding('gpt2');
  const decoder = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
  const EOT = 50256;

  const texts = args.files.map((file) => {
    try {
      return decoder.decode(fs.readFileSync(file));
    } catch (e) {
      fail(`${file}: cannot read (${e.code || e.message})`);
    }
  });
  let bytes = 0;
  for (const file of args.files) bytes += fs.statSync(file).size;

  const start = process.hrtime.bigint();
  const perFile = texts.map((text) => encoding.encode(text, [], []));
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;

  let total = 0;
  for (const tokens of perFile) total += tokens.length + (args.eot ? 1 : 0);
  if (args.out) {
    const out = new Uint16Array(total);
    let at = 0;
    const offsets = [];
    perFile.forEach((tokens, i) => {
      offsets.push(`${at}\t${args.files[i]}`);
      if (args.eot) out[at++] = EOT;
      out.set(tokens, at);
      at += tokens.length;
    });
    fs.writeFileSync(args.out, Buffer.from(out.buffer, out.byteOffset, out.byteLength));
    if (args.offsets) fs.writeFileSync(args.offsets, offsets.join('\n') + '\n');
  }
  if (args.bench) {
    const tokens = perFile.reduce((sum, t) => sum + t.length, 0);
    console.log(`js-tiktoken: ${args.files.length} documents, ${(bytes / 1e6).toFixed(2)} MB -> ${tokens} tokens; ` +
      `encode ${seconds.toFixed(3)} s: ${(bytes / 1e6 / seconds).toFixed(2)} MB/s, ` +
      `${(tokens / 1e6 / seconds).toFixed(3)} M tokens/s`);
  }
}

main();
