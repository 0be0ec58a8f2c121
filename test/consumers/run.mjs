#!/usr/bin/env node
// Consumer tests: pack nestjs-dislock, install the tarball into small real apps as a new user
// would, and check them over HTTP against redis-server processes started here.
//
//   node test/consumers/run.mjs [--node 22,24,26] [--app nest12-esm,nest11-cjs] [--keep] [--prebuilt]
//
// --prebuilt packs the dist/ already there instead of running `npm run build` first (CI, which has
// just built it).
//
// Plain Node, no dependencies. Every wait is bounded; whatever is started here (redis-server,
// apps, npm) is killed on the way out, also on failure, timeout or Ctrl-C.
import { spawn } from 'node:child_process';
import { cpSync, createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');
const KEY_PREFIX = 'dislock:'; // the module's default keyPrefix; the apps keep it
const OPERATION_TIMEOUT = 1_000; // the apps' `operationTimeout`
const DEADLINE_MS = 15 * 60_000; // the whole run, whatever happens

// Each app is built with its own tsconfig (`tsc -p tsconfig.build.json`); `typecheck` adds more
// ways a user's project may see the package's types (labels as printed).
const LIB_CHECK = ['-p', 'tsconfig.build.json', '--noEmit', '--incremental', 'false', '--skipLibCheck', 'false'];
const APPS = {
  'nest12-esm': {
    platforms: ['express', 'fastify'],
    typecheck: {
      'nodenext + lib check': LIB_CHECK,
      bundler: ['-p', 'typecheck/tsconfig.bundler.json'],
      node16: ['-p', 'typecheck/tsconfig.node16.json'],
    },
    vitest: true,
    // Jest's ESM mode, as a Nest 12 app runs Jest (jest.config.js).
    jest: ['--experimental-vm-modules', 'node_modules/jest/bin/jest.js', '--ci'],
  },
  'nest11-cjs': {
    platforms: ['express', 'fastify'],
    typecheck: {
      'nodenext + lib check': LIB_CHECK,
      node10: ['-p', 'typecheck/tsconfig.node10.json'],
    },
    vitest: false,
    // Jest's CommonJS mode, with the config `nest new` writes (test/jest-e2e.json).
    jest: ['node_modules/jest/bin/jest.js', '--ci', '--config', './test/jest-e2e.json'],
  },
};
// Jest runs on these of the run's Node versions (a few seconds each; the Node versions users of
// Jest are on, where Jest's ESM mode and require(esm) differ).
const JEST_NODES = new Set(['20', '22', '24']);
// The HTTP runs (one per app, platform and Node version) go last, once every app is built, this
// many at a time: each is mostly waiting (for the app to boot, on a lock held 1.5 s, for Redis to
// be down and back), and two side by side leave their bounds (a 503 within 100 ms once the client
// knows Redis is down, an exit within 1 s of SIGTERM) far from tight on a 2-core machine; the
// builds and tests before them (tsc, Jest, Vitest: CPU) run one at a time.
const HTTP_RUNS_AT_ONCE = 2;

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      node: { type: 'string', default: '22,24,26' },
      app: { type: 'string', default: Object.keys(APPS).join(',') },
      keep: { type: 'boolean', default: false },
      prebuilt: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  }));
} catch (error) {
  usage(error.message);
}
if (args.help) usage('Packs nestjs-dislock and checks it in the apps of test/consumers/ (see its README.md).', 0);
const nodeVersions = args.node
  .split(',')
  .map((v) => v.trim())
  .filter(Boolean);
const appNames = args.app
  .split(',')
  .map((a) => a.trim())
  .filter(Boolean);
for (const name of appNames) if (!APPS[name]) usage(`unknown app "${name}" (known: ${Object.keys(APPS).join(', ')})`);
if (nodeVersions.length === 0) usage('--node needs at least one version');

function usage(message, code = 2) {
  console[code ? 'error' : 'log'](
    `${message}\nusage: node test/consumers/run.mjs [--node 22,24,26] [--app ${Object.keys(APPS).join(',')}] [--keep] [--prebuilt]`,
  );
  process.exit(code);
}

// ---------------------------------------------------------------- processes, always cleaned up

const children = new Set();
const work = mkdtempSync(join(tmpdir(), 'dislock-consumers-'));
const started = Date.now();
let cleanedUp = false;

function killAll() {
  for (const child of children) {
    try {
      process.kill(-child.pid, 'SIGKILL'); // each child leads its own process group (detached)
    } catch {
      /* already gone */
    }
  }
  children.clear();
}

function cleanup({ removeWork }) {
  if (cleanedUp) return;
  cleanedUp = true;
  killAll();
  if (removeWork) rmSync(work, { recursive: true, force: true });
}

process.on('exit', () => killAll());
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(signal, () => {
    console.error(`\n${signal}: stopping everything this run started (work dir kept: ${work})`);
    cleanup({ removeWork: false });
    process.exit(130);
  });
}
const deadline = setTimeout(() => {
  console.error(`\nThe run passed its deadline of ${DEADLINE_MS / 60_000} min; stopping (work dir kept: ${work})`);
  cleanup({ removeWork: false });
  process.exit(1);
}, DEADLINE_MS);
deadline.unref();

/**
 * Starts a process in a process group of its own, output to `log` (and the last 64 KiB kept).
 * `exited` resolves with { code, signal } and never rejects.
 */
function start(command, argv, { cwd = work, env = {}, log } = {}) {
  const child = spawn(command, argv, {
    cwd,
    env: { ...process.env, ...env },
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  const file = log ? createWriteStream(log, { flags: 'a' }) : undefined;
  let tail = '';
  let stdout = '';
  const keep = (chunk) => {
    file?.write(chunk);
    tail = (tail + chunk.toString()).slice(-65_536);
  };
  child.stdout.on('data', (chunk) => {
    stdout = (stdout + chunk.toString()).slice(-4_194_304);
    keep(chunk);
  });
  child.stderr.on('data', keep);
  const exited = new Promise((resolveExit) => {
    child.on('error', (error) => {
      keep(`\n[spawn ${command}: ${error.message}]\n`);
      children.delete(child);
      file?.end();
      resolveExit({ code: -1, signal: null });
    });
    child.on('close', (code, signal) => {
      children.delete(child);
      file?.end();
      resolveExit({ code, signal });
    });
  });
  return { child, exited, output: () => tail, stdout: () => stdout, running: () => children.has(child) };
}

/** Runs a command to its end, at most `timeout` ms (then it and its group are killed). */
async function run(command, argv, { timeout = 120_000, ...options } = {}) {
  const t0 = Date.now();
  const proc = start(command, argv, options);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    kill(proc, 'SIGKILL');
  }, timeout);
  const { code, signal } = await proc.exited;
  clearTimeout(timer);
  const ms = Date.now() - t0;
  return { ok: code === 0 && !timedOut, code, signal, timedOut, ms, output: proc.output(), stdout: proc.stdout() };
}

function kill(proc, signal) {
  try {
    process.kill(-proc.child.pid, signal);
  } catch {
    /* already gone */
  }
}

/** Waits for `proc` to exit, at most `ms`; true when it did. */
async function exitWithin(proc, ms) {
  let timer;
  const outcome = await Promise.race([
    proc.exited.then(() => true),
    new Promise((r) => (timer = setTimeout(() => r(false), ms))),
  ]);
  clearTimeout(timer);
  return outcome;
}

function describeRun(what, result) {
  const why = result.timedOut ? 'timed out' : `exited ${result.code ?? result.signal}`;
  return `${what} ${why}:\n${indent(lastLines(result.output, 40))}`;
}

const lastLines = (text, n) => text.trimEnd().split('\n').slice(-n).join('\n');
const indent = (text) => text.replace(/^/gm, '    ');
const seconds = (ms) => `${(ms / 1000).toFixed(1)}s`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

/** Polls `probe` (truthy = done) every `every` ms, at most `ms`; returns its last value. */
async function poll(probe, { ms, every = 100 }) {
  const until = Date.now() + ms;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value || Date.now() >= until) return value;
    await sleep(every);
  }
}

// ---------------------------------------------------------------- redis-server of our own

async function redisCli(port, ...command) {
  const result = await run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...command], { timeout: 5_000 });
  if (!result.ok) throw new Error(describeRun(`redis-cli ${command.join(' ')}`, result));
  return result.stdout.trim();
}

async function startRedis(port, log) {
  const proc = start(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    { log },
  );
  const up = await poll(async () => proc.running() && (await redisCli(port, 'PING')) === 'PONG', { ms: 5_000 });
  if (!up) {
    kill(proc, 'SIGKILL');
    throw new Error(
      `redis-server on port ${port} did not answer PING within 5 s:\n${indent(lastLines(proc.output(), 20))}`,
    );
  }
  return proc;
}

async function stopRedis(proc) {
  if (!proc?.running()) return;
  kill(proc, 'SIGTERM');
  if (!(await exitWithin(proc, 5_000))) {
    kill(proc, 'SIGKILL');
    await exitWithin(proc, 2_000);
  }
}

/** Real lock keys under the prefix; the fencing counters (`<prefix>#fence:{tag}`) stay by design. */
async function lockKeys(port) {
  const out = await redisCli(port, '--scan', '--pattern', `${KEY_PREFIX}*`);
  return out
    .split('\n')
    .map((k) => k.trim())
    .filter((k) => k && !k.startsWith(`${KEY_PREFIX}#fence:`));
}

// ---------------------------------------------------------------- HTTP

async function get(url, timeout = 5_000) {
  const t0 = Date.now();
  const response = await fetch(url, { signal: AbortSignal.timeout(timeout) });
  const text = await response.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  return { status: response.status, body, text, ms: Date.now() - t0 };
}

const show = (r) => `${r.status} ${r.text.slice(0, 300)}`;

/**
 * The message Nest's default filter puts in the body of a 503 for RedisUnavailableError (`expose:
 * false`): the status text from @nestjs/core 11.2.8 on (and on 12), which reads `expose`; the error's
 * own message (`Could not acquire lock "...": ...`) before it.
 */
function expected503Message(dir) {
  const { version } = JSON.parse(readFileSync(join(dir, 'node_modules/@nestjs/core/package.json'), 'utf8'));
  const [major, minor, patch] = version.split('.').map(Number);
  const readsExpose = major > 11 || (major === 11 && (minor > 2 || (minor === 2 && patch >= 8)));
  return { version, message: readsExpose ? 'Service Unavailable' : /^Could not acquire lock "/ };
}

// ---------------------------------------------------------------- results

const results = [];

function report(ok, app, what, ms, details = [], notes = []) {
  results.push({ ok, app, what, ms, details });
  const note = notes.length ? `  (${notes.join('; ')})` : '';
  console.log(`${ok ? 'PASS' : 'FAIL'}  ${app.padEnd(11)} ${what.padEnd(34)} ${seconds(ms).padStart(6)}${note}`);
  for (const detail of details) console.log(indent(detail));
}

/** Runs `fn(fail, note)`; the step fails if `fn` throws or calls `fail`. Returns whether it passed. */
async function step(app, what, fn) {
  const t0 = Date.now();
  const failures = [];
  const notes = [];
  try {
    await fn(
      (message) => failures.push(message),
      (message) => notes.push(message),
    );
  } catch (error) {
    failures.push(error instanceof Error ? error.message : String(error));
  }
  report(failures.length === 0, app, what, Date.now() - t0, failures, notes);
  return failures.length === 0;
}

// ---------------------------------------------------------------- the steps

async function buildAndPack() {
  let tarball;
  const what = args.prebuilt ? 'npm pack (dist/ as built)' : 'npm run build + npm pack';
  const ok = await step('package', what, async (fail) => {
    if (args.prebuilt) {
      if (!existsSync(join(ROOT, 'dist', 'index.js')) || !existsSync(join(ROOT, 'dist', 'esm', 'index.js'))) {
        return fail('--prebuilt: no dist/index.js or dist/esm/index.js; run `npm run build` first');
      }
    } else {
      const build = await run('npm', ['run', 'build'], { cwd: ROOT, timeout: 180_000, log: join(work, 'build.log') });
      if (!build.ok) return fail(describeRun('npm run build', build));
    }
    const pack = await run('npm', ['pack', '--json', '--pack-destination', work], { cwd: ROOT, timeout: 60_000 });
    if (!pack.ok) return fail(describeRun('npm pack', pack));
    tarball = join(work, JSON.parse(pack.stdout)[0].filename);
  });
  return ok ? tarball : undefined;
}

/** node@V from npm's `node` package, resolved once to its binary, which is then spawned directly. */
async function resolveNode(version) {
  const result = await run(
    'npx',
    ['-y', '-p', `node@${version}`, 'node', '-p', 'process.execPath + " " + process.version'],
    { timeout: 300_000 },
  );
  if (!result.ok) throw new Error(describeRun(`npx -p node@${version}`, result));
  const line = result.stdout.trim().split('\n').at(-1);
  const [bin, full] = line.split(' ');
  if (!full?.startsWith(`v${version}`)) throw new Error(`npx -p node@${version} gave "${line}"`);
  return { version, full, bin };
}

async function install(name, tarball) {
  const dir = join(work, name);
  const ok = await step(name, 'npm install (tarball + deps)', async (fail, note) => {
    cpSync(join(HERE, name), dir, {
      recursive: true,
      filter: (src) => !/[/\\](node_modules|dist)([/\\]|$)|\.tsbuildinfo$/.test(src),
    });
    // The module, the controller the HTTP checks below talk to, and the type-check file are the
    // same in every app: one copy in shared/, laid into each app here.
    cpSync(join(HERE, 'shared'), dir, { recursive: true });
    // Plain `npm install`: no --legacy-peer-deps, no --force; peers must be satisfied as they are.
    const result = await run('npm', ['install', '--no-audit', '--no-fund', tarball], {
      cwd: dir,
      timeout: 420_000,
      log: join(work, `${name}.install.log`),
    });
    if (!result.ok) return fail(describeRun('npm install', result));
    const peerWarnings = result.output.split('\n').filter((l) => /peer|ERESOLVE/i.test(l) && /warn/i.test(l));
    if (peerWarnings.length) note(`npm warned about peers: ${peerWarnings.slice(0, 3).join(' | ')}`);
  });
  return ok ? dir : undefined;
}

async function buildApp(name, dir) {
  return step(name, 'tsc build + types', async (fail, note) => {
    const tsc = join(dir, 'node_modules', 'typescript', 'bin', 'tsc');
    const version = await run(process.execPath, [tsc, '--version'], { cwd: dir, timeout: 30_000 });
    note(version.stdout.trim());
    const checks = { build: ['-p', 'tsconfig.build.json'], ...APPS[name].typecheck };
    const results = await Promise.all(
      Object.values(checks).map((argv) => run(process.execPath, [tsc, ...argv], { cwd: dir, timeout: 180_000 })),
    );
    Object.entries(checks).forEach(([label, argv], i) => {
      if (!results[i].ok) fail(describeRun(`${label}: tsc ${argv.join(' ')}`, results[i]));
    });
    note(Object.keys(checks).join(', '));
  });
}

/** npm's view (one version of each peer, no problems) and Node's (same file, same module at run time). */
async function oneCopy(name, dir, node) {
  return step(name, 'one @nestjs/common', async (fail, note) => {
    const peers = ['@nestjs/common', '@nestjs/core', 'ioredis', 'rxjs', 'reflect-metadata'];
    const ls = await run('npm', ['ls', ...peers, '--all', '--json'], { cwd: dir, timeout: 60_000 });
    if (!ls.ok) fail(describeRun('npm ls (peers)', ls));
    const versions = new Map(peers.map((p) => [p, new Set()]));
    const walk = (deps = {}) => {
      for (const [pkg, info] of Object.entries(deps)) {
        if (versions.has(pkg) && info.version) versions.get(pkg).add(info.version);
        walk(info.dependencies);
      }
    };
    try {
      walk(JSON.parse(ls.stdout).dependencies);
    } catch (error) {
      fail(`npm ls --json did not parse: ${error.message}`);
    }
    for (const [pkg, set] of versions) {
      if (set.size !== 1) fail(`npm ls: ${set.size} versions of ${pkg}: ${[...set].join(', ') || 'none'}`);
    }
    note(`${[...versions.get('@nestjs/common')].join(', ')} per npm ls`);

    const script = `
      import { createRequire } from 'node:module';
      import { fileURLToPath } from 'node:url';
      // Both builds of the library: the ES modules (import) and the CommonJS (require).
      const builds = {
        esm: fileURLToPath(import.meta.resolve('nestjs-dislock')),
        cjs: createRequire(import.meta.url).resolve('nestjs-dislock'),
      };
      const out = {};
      for (const [build, lib] of Object.entries(builds)) {
        const requireFromLib = createRequire(lib);
        for (const pkg of ['@nestjs/common', '@nestjs/core']) {
          const fromLib = requireFromLib.resolve(pkg);
          const fromApp = fileURLToPath(import.meta.resolve(pkg));
          const same = requireFromLib(pkg).Injectable === (await import(pkg)).Injectable;
          out[build + ' ' + pkg] = { lib, fromLib, fromApp, same };
        }
      }
      console.log(JSON.stringify(out));
    `;
    const result = await run(node.bin, ['--input-type=module', '-e', script], { cwd: dir, timeout: 30_000 });
    if (!result.ok) return fail(describeRun(`node ${node.full} (resolve check)`, result));
    const out = JSON.parse(result.stdout.trim().split('\n').at(-1));
    for (const [what, { lib, fromLib, fromApp, same }] of Object.entries(out)) {
      if (fromLib !== fromApp) fail(`${what}: the library (${lib}) resolves ${fromLib}, the app ${fromApp}`);
      if (!same) fail(`${what}: the library (${lib}) and import() from the app give different modules`);
    }
    const [esm, cjs] = ['esm', 'cjs'].map((build) => out[`${build} @nestjs/common`].lib);
    if (!/[/\\]dist[/\\]esm[/\\]index\.js$/.test(esm)) fail(`import loads ${esm}, not the ES module build`);
    if (!/[/\\]dist[/\\]index\.js$/.test(cjs)) fail(`require loads ${cjs}, not the CommonJS build`);
  });
}

/** The app's own Vitest suite, as `nest new` configures it (Oxc) and through SWC (Nest's recipe). */
async function vitest(name, dir, node) {
  const configs = { 'as nest new': 'vitest.config.ts', swc: 'vitest.config.swc.ts' };
  for (const [label, config] of Object.entries(configs)) {
    await step(name, `vitest (${label}), node ${node.full}`, async (fail) => {
      const port = await freePort();
      const redis = await startRedis(port, join(work, `${name}.vitest.redis.log`));
      try {
        const result = await run(
          node.bin,
          [join(dir, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '--config', config],
          {
            cwd: dir,
            timeout: 180_000,
            env: { REDIS_URL: `redis://127.0.0.1:${port}`, CI: 'true', NO_COLOR: '1' },
            log: join(work, `${name}.vitest.log`),
          },
        );
        if (!result.ok) fail(describeRun(`vitest run --config ${config}`, result));
      } finally {
        await stopRedis(redis);
      }
    });
  }
}

/** The app's own Jest suite: its AppModule on the memory store, then on a redis-server of our own. */
async function jest(name, dir, node) {
  await step(name, `jest, node ${node.full}`, async (fail) => {
    const port = await freePort();
    const redis = await startRedis(port, join(work, `${name}.jest.redis.log`));
    try {
      const result = await run(node.bin, APPS[name].jest, {
        cwd: dir,
        timeout: 180_000,
        env: { REDIS_URL: `redis://127.0.0.1:${port}`, CI: 'true', NO_COLOR: '1' },
        log: join(work, `${name}.jest.node${node.version}.log`),
      });
      if (!result.ok) fail(describeRun(`jest (node ${node.full})`, result));
    } finally {
      await stopRedis(redis);
    }
  });
}

/** Named imports of the package from ESM (`import { }`) and CommonJS (`require`), with this Node. */
async function imports(name, dir, node) {
  return step(name, `imports, node ${node.full}`, async (fail, note) => {
    const check = `for (const [k, v] of Object.entries({ DisLockModule, DisLock, LockService }))
      if (typeof v !== 'function') throw new Error(k + ' is ' + typeof v);`;
    const forms = {
      'ESM import': [
        '--input-type=module',
        '-e',
        `import { DisLockModule, DisLock, LockService } from 'nestjs-dislock'; ${check}`,
      ],
      'CJS require': ['-e', `const { DisLockModule, DisLock, LockService } = require('nestjs-dislock'); ${check}`],
    };
    for (const [form, argv] of Object.entries(forms)) {
      const result = await run(node.bin, argv, { cwd: dir, timeout: 30_000 });
      if (!result.ok) fail(describeRun(form, result));
      else if (/Warning/.test(result.output)) note(`${form}: ${lastLines(result.output, 1).trim()}`);
    }
  });
}

/** The app on its own redis-server, over real HTTP: free, busy, Redis down, Redis back, SIGTERM. */
async function httpChecks(name, dir, node, platform) {
  const label = `${platform}, node ${node.full}`;
  return step(name, label, async (fail, note) => {
    const tag = `${name}.${platform}.node${node.version}`;
    const redisPort = await freePort();
    let redis = await startRedis(redisPort, join(work, `${tag}.redis.log`));
    const appPort = await freePort();
    const base = `http://127.0.0.1:${appPort}`;
    const app = start(node.bin, ['dist/main.js'], {
      cwd: dir,
      env: { PORT: String(appPort), REDIS_URL: `redis://127.0.0.1:${redisPort}`, PLATFORM: platform, NO_COLOR: '1' },
      log: join(work, `${tag}.app.log`),
    });
    const appLog = () => indent(lastLines(app.output(), 25));
    try {
      const t0 = Date.now();
      const up = await poll(
        async () => !app.running() || (await fetch(base, { signal: AbortSignal.timeout(1_000) })).status > 0,
        { ms: 30_000 },
      );
      if (!up || !app.running()) {
        return fail(`the app ${app.running() ? 'did not answer HTTP within 30 s' : 'exited at start'}:\n${appLog()}`);
      }
      note(`boot ${seconds(Date.now() - t0)}`);

      // A free lock, through @DisLock and through LockService.
      const free = await get(`${base}/hold/free?ms=0`);
      if (free.status !== 200 || free.body?.key !== 'free')
        fail(`free lock: expected 200 {key:'free'}, got ${show(free)}`);
      const service = await get(`${base}/service/svc`);
      if (
        service.status !== 200 ||
        service.body?.key !== `${KEY_PREFIX}svc` ||
        typeof service.body?.fencingToken !== 'number'
      ) {
        fail(`LockService: expected 200 {key:'${KEY_PREFIX}svc', fencingToken}, got ${show(service)}`);
      }

      // Two concurrent requests on one key: one runs, one is told the lock is busy; for a Promise and
      // an Observable method. While the first holds it, LockService sees the same lock busy too.
      const pairs = ['hold', 'stream'].map((route) =>
        Promise.all([get(`${base}/${route}/busy?ms=1500`), get(`${base}/${route}/busy?ms=1500`)]),
      );
      const held = await poll(async () => (await redisCli(redisPort, 'EXISTS', `${KEY_PREFIX}hold:busy`)) === '1', {
        ms: 3_000,
      });
      if (!held) fail(`the lock key ${KEY_PREFIX}hold:busy never appeared in Redis`);
      const sameLock = await get(`${base}/service/hold:busy`);
      for (const [i, route] of ['hold', 'stream'].entries()) {
        const [a, b] = await pairs[i];
        const statuses = [a.status, b.status].sort();
        if (statuses.join() !== '200,409') {
          fail(`two concurrent /${route}/busy: expected 200 + 409, got ${show(a)} | ${show(b)}`);
        }
        const busy = [a, b].find((r) => r.status === 409);
        if (busy) {
          const { statusCode, message } = busy.body ?? {};
          if (statusCode !== 409 || typeof message !== 'string' || !message.includes(`${route}:busy`)) {
            fail(`409 body: expected { statusCode: 409, message naming "${route}:busy" }, got ${busy.text}`);
          }
        }
      }
      if (sameLock.status !== 409) fail(`LockService on a lock @DisLock holds: expected 409, got ${show(sameLock)}`);

      // Redis down: a bounded 503 that says nothing about where Redis is or how it failed.
      await stopRedis(redis);
      const bound = OPERATION_TIMEOUT + 4_000;
      const down = await Promise.all(
        [`${base}/hold/down?ms=0`, `${base}/service/down`].map((url) =>
          get(url, bound).catch((error) => ({
            status: 0,
            text: `no answer within ${bound} ms (${error.name})`,
            ms: bound,
          })),
        ),
      );
      const nest = expected503Message(dir);
      for (const r of down) {
        if (r.status !== 503) fail(`Redis stopped: expected 503 within ${bound} ms, got ${show(r)} after ${r.ms} ms`);
        const message = r.body?.message;
        const matches =
          typeof nest.message === 'string' ? message === nest.message : nest.message.test(String(message));
        if (r.status === 503 && (r.body?.statusCode !== 503 || !matches)) {
          fail(`503 body on @nestjs/core ${nest.version}: expected message ${nest.message}, got ${r.text}`);
        }
        const leaks = ['127.0.0.1', 'localhost', String(redisPort), 'ECONNREFUSED', 'connect'].filter((s) =>
          r.text.toLowerCase().includes(s.toLowerCase()),
        );
        if (leaks.length) fail(`503 body reveals ${leaks.map((s) => `"${s}"`).join(', ')}: ${r.text}`);
      }
      note(`Redis-down answer in ${Math.max(...down.map((r) => r.ms))} ms`);
      // Those first calls met a client that had only seen the drop; by their answer it has seen its
      // reconnection attempts refused, and knows Redis is down: now a call fails at once
      // (`whenDisconnected: 'fail'`) instead of waiting operationTimeout in the offline queue.
      const FAST_MS = 100;
      const fast = await get(`${base}/hold/down?ms=0`, bound).catch((error) => ({
        status: 0,
        text: `no answer within ${bound} ms (${error.name})`,
        ms: bound,
      }));
      if (fast.status !== 503 || fast.ms >= FAST_MS) {
        fail(`Redis known down: expected 503 within ${FAST_MS} ms, got ${show(fast)} after ${fast.ms} ms`);
      }
      note(`then ${fast.ms} ms`);

      // Redis back on the same port: locks work again.
      redis = await startRedis(redisPort, join(work, `${tag}.redis.log`));
      const back = await poll(async () => (await get(`${base}/service/back`, 3_000)).status === 200, {
        ms: 15_000,
        every: 200,
      });
      if (!back) return fail(`Redis restarted, but /service/back did not answer 200 within 15 s:\n${appLog()}`);

      // SIGTERM while a lock is held: enableShutdownHooks() releases it; only fencing counters remain.
      const inFlight = get(`${base}/hold/shutdown?ms=20000`, 25_000).catch(() => undefined);
      const taken = await poll(
        async () => (await redisCli(redisPort, 'EXISTS', `${KEY_PREFIX}hold:shutdown`)) === '1',
        {
          ms: 3_000,
        },
      );
      if (!taken) return fail(`the lock ${KEY_PREFIX}hold:shutdown was never taken:\n${appLog()}`);
      const t1 = Date.now();
      kill(app, 'SIGTERM');
      if (!(await exitWithin(app, 10_000))) {
        fail(`the app did not exit within 10 s of SIGTERM while holding a lock:\n${appLog()}`);
      } else {
        const exitMs = Date.now() - t1;
        // enableShutdownHooks(): the held lock is released and the app exits, well under a second.
        if (exitMs >= 1_000) fail(`the app took ${exitMs} ms to exit on SIGTERM while holding a lock`);
        note(`SIGTERM exit ${seconds(exitMs)}`);
      }
      await inFlight;
      const left = await lockKeys(redisPort);
      if (left.length) fail(`after SIGTERM Redis still holds lock keys: ${left.join(', ')}`);
      if (/ExperimentalWarning/.test(app.output())) note('app printed an ExperimentalWarning');
    } finally {
      kill(app, 'SIGKILL');
      await exitWithin(app, 2_000);
      await stopRedis(redis);
    }
  });
}

// ---------------------------------------------------------------- main

async function main() {
  const npmVersion = (await run('npm', ['--version'], { timeout: 30_000 })).stdout.trim();
  console.log(
    `consumer tests: apps ${appNames.join(', ')}; node ${nodeVersions.join(', ')}; npm ${npmVersion}; work dir ${work}`,
  );

  const redisOk = await step('setup', 'redis-server and redis-cli on PATH', async (fail, note) => {
    for (const tool of ['redis-server', 'redis-cli']) {
      const version = await run(tool, ['--version'], { timeout: 10_000 });
      if (!version.ok) fail(`${tool} --version failed (install Redis: apt-get install redis-server)`);
      else if (tool === 'redis-server') note(version.stdout.trim().split(' ').slice(0, 3).join(' '));
    }
  });
  if (!redisOk) return finish();

  // Node binaries resolve (and download, the first time) while the package builds and the apps install.
  const nodesPromise = (async () => {
    const t0 = Date.now();
    const nodes = [];
    for (const version of nodeVersions) {
      try {
        nodes.push(await resolveNode(version));
      } catch (error) {
        nodes.push({ version, error: error.message });
      }
    }
    return { nodes, ms: Date.now() - t0 };
  })();

  const tarball = await buildAndPack();
  const installed = tarball
    ? await Promise.all(appNames.map((name) => install(name, tarball)))
    : appNames.map(() => undefined);

  const { nodes, ms: nodeMs } = await nodesPromise;
  for (const node of nodes) {
    if (node.error) report(false, 'node', `node@${node.version}`, nodeMs, [node.error]);
  }
  const usable = nodes.filter((n) => !n.error);
  console.log(`node binaries: ${usable.map((n) => n.full).join(', ') || 'none'} (${seconds(nodeMs)})`);

  /** The HTTP runs, started once every app has been built and tested otherwise. */
  const httpRuns = [];
  for (const [i, name] of appNames.entries()) {
    const dir = installed[i];
    const app = APPS[name];
    const runs = [
      ...usable.filter((n) => JEST_NODES.has(n.version)).map((n) => `jest, node ${n.full}`),
      ...usable.flatMap((node) => [
        `imports, node ${node.full}`,
        ...app.platforms.map((p) => `${p}, node ${node.full}`),
      ]),
    ];
    if (!dir || usable.length === 0) {
      for (const what of runs) report(false, name, what, 0, ['not run: the package or the app did not install']);
      continue;
    }
    const built = await buildApp(name, dir);
    await oneCopy(name, dir, usable[0]);
    if (app.vitest) await vitest(name, dir, usable[0]);
    for (const node of usable.filter((n) => JEST_NODES.has(n.version))) await jest(name, dir, node);
    for (const node of usable) {
      await imports(name, dir, node);
      for (const platform of app.platforms) {
        if (built) httpRuns.push(() => httpChecks(name, dir, node, platform));
        else report(false, name, `${platform}, node ${node.full}`, 0, ['not run: the app did not build']);
      }
    }
  }
  await Promise.all(
    Array.from({ length: HTTP_RUNS_AT_ONCE }, async () => {
      for (let next = httpRuns.shift(); next; next = httpRuns.shift()) await next();
    }),
  );

  finish();
}

function finish() {
  const failed = results.filter((r) => !r.ok).length;
  const passed = results.length - failed;
  console.log(`total ${seconds(Date.now() - started)}${failed || args.keep ? `; logs in ${work}` : ''}`);
  cleanup({ removeWork: failed === 0 && !args.keep });
  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
}

main().catch((error) => {
  console.error(error);
  cleanup({ removeWork: false });
  console.log(`${results.filter((r) => r.ok).length} passed, ${results.filter((r) => !r.ok).length + 1} failed`);
  process.exitCode = 1;
});
