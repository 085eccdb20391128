// Reference encoder for the Hugging Face tokenizer.json oracle test and benchmark: encodes files with Hugging
// Face's own JavaScript tokenizers (@huggingface/tokenizers), an implementation independent of ours. Files are
// decoded like any standard UTF-8 reader does (WHATWG TextDecoder: invalid bytes become U+FFFD, a leading BOM is
// kept), and encoding adds nothing (add_special_tokens: false, so no BOS/EOS or post-processor template), while
// added tokens inside the text (e.g. "<|endoftext|>") are still recognised and emitted as their ids.
//
// usage: node dev/reference/hf_tokenizers_encode.js [--modules DIR] [--bench] TOKENIZER.json FILE...
//   --modules DIR   node_modules holding @huggingface/tokenizers (default: data/cache/node/node_modules)
//   --bench         print encode-only throughput (excludes loading the tokenizer and reading files) instead of ids
// Without --bench, prints one line per file: its ids as a JSON array.
'use strict';
const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(`error: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = { modules: path.join(__dirname, '..', '..', 'data', 'cache', 'node', 'node_modules'), bench: false,
    files: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--modules') {
      if (i + 1 >= argv.length) fail(`${a}: missing value`);
      args.modules = argv[++i];
    } else if (a === '--bench') args.bench = true;
    else if (a.startsWith('--')) fail(`unknown flag ${a}`);
    else args.files.push(a);
  }
  if (args.files.length < 2) fail('usage: hf_tokenizers_encode.js [--modules DIR] [--bench] TOKENIZER.json FILE...');
  return args;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  let Tokenizer;
  try {
    ({ Tokenizer } = require(path.resolve(args.modules, '@huggingface/tokenizers')));
  } catch (e) {
    fail(`cannot load @huggingface/tokenizers from ${args.modules} (run data/prepare_default.sh)`);
  }
  const [tokenizerPath, ...files] = args.files;
  let json;
  try {
    json = JSON.parse(fs.readFileSync(tokenizerPath, 'utf8'));
  } catch (e) {
    fail(`${tokenizerPath}: cannot read (${e.code || e.message})`);
  }
  const tokenizer = new Tokenizer(json, {});
  const decoder = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
  const texts = files.map((file) => {
    try {
      return decoder.decode(fs.readFileSync(file));
    } catch (e) {
      fail(`${file}: cannot read (${e.code || e.message})`);
    }
  });
  const start = process.hrtime.bigint();
  const ids = texts.map((text) => tokenizer.encode(text, { add_special_tokens: false }).ids);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  if (args.bench) {
    let bytes = 0;
    for (const file of files) bytes += fs.statSync(file).size;
    const tokens = ids.reduce((sum, t) => sum + t.length, 0);
    console.log(`@huggingface/tokenizers ${path.basename(path.dirname(path.dirname(tokenizerPath)))}: ` +
      `${files.length} documents, ${(bytes / 1e6).toFixed(2)} MB -> ${tokens} tokens; encode ${seconds.toFixed(3)} s: ` +
      `${(bytes / 1e6 / seconds).toFixed(2)} MB/s, ${(tokens / 1e6 / seconds).toFixed(3)} M tokens/s`);
    return;
  }
  const out = fs.createWriteStream(null, { fd: 1 });
  for (const list of ids) out.write(JSON.stringify(list) + '\n');
  out.end();
}

main();
