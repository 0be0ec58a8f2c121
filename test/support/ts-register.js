// A require hook so that a plain `node` process can run this repository's TypeScript (lib/, test/):
//
//   node -r ./test/support/ts-register.js test/support/workers/<worker>.ts [args...]
//
// Every `.ts` file outside node_modules is transpiled on load with `typescript.transpileModule`
// (no type checking: `npm run typecheck` does that) using the compiler options of tsconfig.json,
// emitted as CommonJS, with decorators and their metadata as Nest needs them. The package name
// 'nestjs-dislock' resolves to lib/index.ts, as in tsconfig's `paths` and the Vitest config's alias.
//
// Outputs are cached in $TMPDIR/dislock-ts-register-<uid>/, keyed by a hash of everything they depend on
// (TypeScript's version, tsconfig.json, this file, the file's name and source), so that many
// workers start fast; an edited file simply gets a new entry. TypeScript itself is loaded only on
// a miss (loading it is ~0.2 s of CPU, in every worker process). DISLOCK_TS_CACHE=off disables the
// cache, and Node's compile cache, which is on too where Node has one (22.1 on): the V8 code of
// Nest, ioredis, rxjs, ... is then not compiled again by every worker.
'use strict';

const Module = require('node:module');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');
const { createHash } = require('node:crypto');

if (process.env.DISLOCK_TS_CACHE !== 'off') Module.enableCompileCache?.();

const root = path.resolve(__dirname, '..', '..');
const tsconfigPath = path.join(root, 'tsconfig.json');
const libIndex = path.join(root, 'lib', 'index.ts');
const nodeModules = `${path.sep}node_modules${path.sep}`;

/** @type {import('typescript').CompilerOptions | undefined} */
let compilerOptions;
/** TypeScript and the compiler options, on the first file not in the cache. */
function typescript() {
  const ts = require('typescript');
  if (compilerOptions) return { ts, compilerOptions };
  const { config, error } = ts.readConfigFile(tsconfigPath, ts.sys.readFile);
  if (error) throw new Error(ts.flattenDiagnosticMessageText(error.messageText, '\n'));
  const { options: configured } = ts.convertCompilerOptionsFromJson(config.compilerOptions, root, tsconfigPath);
  compilerOptions = {
    ...configured,
    // What the output must be for require(): CommonJS, one file at a time, source maps inline so
    // that stack traces point into the .ts sources.
    module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    target: ts.ScriptTarget.ES2022,
    experimentalDecorators: true,
    emitDecoratorMetadata: true,
    useDefineForClassFields: false,
    esModuleInterop: true,
    isolatedModules: true,
    declaration: false,
    sourceMap: false,
    inlineSourceMap: true,
    inlineSources: true,
    noEmit: false,
  };
  return { ts, compilerOptions };
}

process.setSourceMapsEnabled(true);

/** The cache directory: private to this user (compiled code is run from it), or none. */
function privateCacheDir() {
  if (process.env.DISLOCK_TS_CACHE === 'off') return undefined;
  const dir = path.join(os.tmpdir(), `dislock-ts-register-${process.getuid?.() ?? 'user'}`);
  try {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const stat = fs.statSync(dir);
    if (process.getuid && (stat.uid !== process.getuid() || (stat.mode & 0o022) !== 0)) return undefined;
    return dir;
  } catch {
    return undefined;
  }
}
const cacheDir = privateCacheDir();
/** What every output depends on besides its own file: TypeScript's version, tsconfig.json, the options above. */
const optionsHash = createHash('sha256')
  .update(fs.readFileSync(require.resolve('typescript/package.json')))
  .update('\0')
  .update(fs.readFileSync(tsconfigPath))
  .update('\0')
  .update(fs.readFileSync(__filename))
  .digest('hex');

function transpile(source, filename) {
  const compile = () => {
    const { ts, compilerOptions: options } = typescript();
    return ts.transpileModule(source, { compilerOptions: options, fileName: filename }).outputText;
  };
  if (!cacheDir) return compile();
  const hash = createHash('sha256').update(`${optionsHash}\0${filename}\0${source}`).digest('hex');
  const cached = path.join(cacheDir, `${hash}.js`);
  try {
    return fs.readFileSync(cached, 'utf8');
  } catch {
    const output = compile();
    try {
      // Write then rename: a process reading the entry at the same time sees all of it or nothing.
      const partial = `${cached}.${process.pid}.tmp`;
      fs.writeFileSync(partial, output);
      fs.renameSync(partial, cached);
    } catch {
      // A read-only or full temp dir only costs speed.
    }
    return output;
  }
}

// Node >= 22.18 strips types of .ts files natively, without decorators; this hook replaces that.
Module._extensions['.ts'] = function compileTypeScript(module, filename) {
  if (filename.includes(nodeModules)) throw new Error(`ts-register: refusing to compile ${filename}`);
  module._compile(transpile(fs.readFileSync(filename, 'utf8'), filename), filename);
};

const resolveFilename = Module._resolveFilename;
Module._resolveFilename = function resolveWithAlias(request, ...rest) {
  return resolveFilename.call(this, request === 'nestjs-dislock' ? libIndex : request, ...rest);
};
