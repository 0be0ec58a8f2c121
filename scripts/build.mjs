// Builds the package (npm run build): lib/ -> dist/ twice, from the same sources.
//
//   dist/        CommonJS and its .d.ts (tsconfig.build.json): the `require` condition of `exports`
//   dist/esm/    ES modules (tsconfig.build-esm.json): the `import` condition
//
// Why both: Nest 12 is ESM only. The CommonJS build require()s it, which Node does (require(esm)),
// but Jest's ESM mode cannot: it runs every CommonJS module of a test's import graph before any ES
// module of that graph, so dist/*.js require()ing @nestjs/common, which the same graph imports,
// fails with "Cannot require() ES Module .../@nestjs/common/index.js in a cycle". An ESM
// application (and Jest's ESM mode, and Vitest) imports the ESM build, which never require()s Nest.
//
// tsc emits the ESM build with the specifiers as the sources write them (`'../errors'`); Node's ESM
// resolution wants the file (`'../errors/index.js'`), so this script adds it, to every relative
// specifier, and fails if one names no emitted file. Then it adds what makes dist/esm/ ESM
// (package.json `"type": "module"`) and its types (index.d.ts: the CommonJS build's, one set).
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const dist = join(root, 'dist');
const esm = join(dist, 'esm');
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');

function compile(project) {
  return new Promise((resolveRun) => {
    const child = spawn(process.execPath, [tsc, '-p', project], { cwd: root, stdio: 'inherit' });
    child.on('close', (code) => resolveRun(code === 0));
  });
}

function* jsFiles(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) yield* jsFiles(path);
    else if (name.endsWith('.js')) yield path;
  }
}

rmSync(dist, { recursive: true, force: true });
// Two tsc processes at once: each is mostly its own type-check of lib/.
const built = await Promise.all(['tsconfig.build.json', 'tsconfig.build-esm.json'].map(compile));
if (!built.every(Boolean)) process.exit(1);

const problems = [];
// Every static and dynamic import/export of a relative specifier, as tsc prints them.
const SPECIFIER = /(\bfrom\s*|\bimport\s*\(?\s*)(['"])(\.\.?\/[^'"]*|\.\.?)\2/g;
let files = 0;
for (const file of jsFiles(esm)) {
  files++;
  const source = readFileSync(file, 'utf8');
  let text = source.replace(SPECIFIER, (whole, lead, quote, specifier) => {
    const target = resolve(dirname(file), specifier);
    if (existsSync(`${target}.js`)) return `${lead}${quote}${specifier}.js${quote}`;
    if (existsSync(join(target, 'index.js'))) return `${lead}${quote}${specifier.replace(/\/$/, '')}/index.js${quote}`;
    if (/\.js$/.test(specifier) && existsSync(target)) return whole;
    problems.push(`${relative(root, file)}: "${specifier}" names no file of the build`);
    return whole;
  });
  // CommonJS-only names do not exist in an ES module. `require` of an optional peer (loaded only
  // when installed, as @opentelemetry/api is) gets a require of its own, as bundlers' shims do.
  for (const name of ['__dirname', '__filename', 'module.exports', 'exports.']) {
    if (text.includes(name)) problems.push(`${relative(root, file)}: uses ${name}, which ESM does not have`);
  }
  if (/\brequire\(/.test(text)) {
    text = `import { createRequire } from 'node:module';\nconst require = createRequire(import.meta.url);\n${text}`;
  }
  if (text !== source) writeFileSync(file, text);
}
if (files === 0) problems.push('dist/esm holds no .js file');

writeFileSync(join(esm, 'package.json'), `${JSON.stringify({ type: 'module' }, null, 2)}\n`);
// One set of types for both builds (they declare the same things): the ESM entry's are the CommonJS
// build's, so that TypeScript sees the same declarations whichever condition resolved the package.
writeFileSync(join(esm, 'index.d.ts'), `export * from '../index.js';\n`);

if (problems.length) {
  console.error(`scripts/build.mjs: the ESM build is broken:\n  ${problems.join('\n  ')}`);
  process.exit(1);
}
