// Checks the package as the registry would ship it (run after `npm run build`):
//   node test/package/check-package.mjs
// 1. `npm pack --dry-run`: exactly the built JavaScript (CommonJS in dist/, ESM in dist/esm/ with
//    its package.json) and declarations, README, CHANGELOG, LICENSE and package.json; no tests,
//    sources, source maps or stray files.
// 2. publint (strict) and @arethetypeswrong/cli: exports, types and module format line up under
//    node10, node16 (from CJS and from ESM) and bundler resolution.
// 3. Named imports of the built package by its own name, from ESM and from CommonJS, see the same
//    exports; `import` loads the ES module build (dist/esm/) and `require` the CommonJS one (dist/),
//    and the ES module build require()s nothing but an optional peer: an ESM application (and
//    Jest's ESM mode, which cannot require() Nest 12 from a module its tests import) never has a
//    require() of Nest on its way. An app that loads both builds is told so when it starts.
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const run = (command, args, options = {}) =>
  execFileSync(command, args, { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], ...options });
const failures = [];
const check = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};

// ---- 1. what npm would publish ------------------------------------------------------------------
const [pack] = JSON.parse(run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts']));
const files = pack.files.map((file) => file.path).sort();
const allowed = [
  /^dist\/.+\.js$/,
  /^dist\/.+\.d\.ts$/,
  /^dist\/esm\/package\.json$/,
  /^(README|CHANGELOG)\.md$/,
  /^LICENSE$/,
  /^package\.json$/,
];
const stray = files.filter((file) => !allowed.some((pattern) => pattern.test(file)));
check(stray.length === 0, `no stray files in the tarball${stray.length ? `: ${stray.join(', ')}` : ''}`);
for (const required of [
  'LICENSE',
  'README.md',
  'CHANGELOG.md',
  'package.json',
  'dist/index.js',
  'dist/index.d.ts',
  'dist/esm/index.js',
  'dist/esm/index.d.ts',
  'dist/esm/package.json',
]) {
  check(files.includes(required), `the tarball has ${required}`);
}
// Test files end in .spec.* or -spec.* (not every name with "spec" in it: inspect.script.js ships).
check(!files.some((file) => /[.-]spec\.|\.map$|^lib\/|^test\//.test(file)), 'no tests, sources or source maps');
console.log(
  `     ${files.length} files, ${(pack.size / 1024).toFixed(1)} kB packed, ${(pack.unpackedSize / 1024).toFixed(1)} kB unpacked`,
);

const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
for (const field of ['license', 'repository', 'homepage', 'bugs', 'engines']) {
  check(manifest[field] !== undefined, `package.json has "${field}"`);
}
const changelog = readFileSync(join(root, 'CHANGELOG.md'), 'utf8');
check(
  new RegExp(`^## ${manifest.version.replace(/\./g, '\\.')} \\(\\d{4}-\\d{2}-\\d{2}\\)$`, 'm').test(changelog),
  `CHANGELOG has a dated heading for ${manifest.version}`,
);
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const relative = [...readme.matchAll(/!?\[[^\]]*\]\(([^)#][^)]*)\)/g)]
  .map((m) => m[1])
  .filter((u) => !/^https?:/.test(u));
check(
  relative.length === 0,
  `README links are absolute (the registry page has no repository beside it)${relative.length ? `: ${relative.join(', ')}` : ''}`,
);

// ---- 2. publint and arethetypeswrong --------------------------------------------------------------
const tool = (name, args) => {
  try {
    const out = run(join(root, 'node_modules', '.bin', name), args);
    check(true, `${name} ${args.join(' ')}`);
    return out;
  } catch (error) {
    console.log(`${error.stdout ?? ''}${error.stderr ?? ''}`);
    check(false, `${name} ${args.join(' ')}`);
    return '';
  }
};
tool('publint', ['--strict']);
tool('attw', ['--pack', '.', '--format', 'table-flipped']);

// ---- 3. named imports from ESM and CommonJS ---------------------------------------------------------
const names = (source, type) =>
  JSON.parse(
    run(process.execPath, [type === 'module' ? '--input-type=module' : '--input-type=commonjs', '-e', source]),
  );
const cjs = names(`console.log(JSON.stringify(Object.keys(require('nestjs-dislock')).sort()))`, 'commonjs');
const esm = names(
  `import * as m from 'nestjs-dislock'; console.log(JSON.stringify(Object.keys(m).filter((k) => k !== 'default' && k !== '__esModule').sort()))`,
  'module',
);
check(
  cjs.length > 0 && JSON.stringify(cjs) === JSON.stringify(esm),
  `ESM and CommonJS see the same ${cjs.length} named exports`,
);
for (const name of ['DisLock', 'DisLockModule', 'LockService', 'DisLockExceptionFilter', 'LockNotAcquiredError']) {
  check(esm.includes(name), `import { ${name} } from 'nestjs-dislock'`);
}

// Which build each loads, by the package's own name.
const [esmEntry, cjsEntry] = [
  names(`console.log(JSON.stringify(import.meta.resolve('nestjs-dislock')))`, 'module'),
  names(`console.log(JSON.stringify(require.resolve('nestjs-dislock')))`, 'commonjs'),
].map((entry) => entry.replace(/^file:\/\//, '').slice(root.length + 1));
check(esmEntry === 'dist/esm/index.js', `import loads the ES module build (${esmEntry})`);
check(cjsEntry === 'dist/index.js', `require loads the CommonJS build (${cjsEntry})`);
const esmType = JSON.parse(readFileSync(join(root, 'dist', 'esm', 'package.json'), 'utf8')).type;
check(esmType === 'module', `dist/esm/package.json says "type": "module" (${esmType})`);
// The ES module build: require() only of @opentelemetry/api (an optional peer, loaded when installed).
const esmFiles = readdirSync(join(root, 'dist', 'esm'), { recursive: true }).filter((f) => f.endsWith('.js'));
const requires = esmFiles.flatMap((file) =>
  [...readFileSync(join(root, 'dist', 'esm', file), 'utf8').matchAll(/\brequire\(\s*([^)]*)\)/g)]
    .map((m) => m[1])
    .filter((arg) => arg !== "'@opentelemetry/api'")
    .map((arg) => `${file}: require(${arg})`),
);
check(
  esmFiles.length > 0 && requires.length === 0,
  `the ES module build require()s only @opentelemetry/api${requires.length ? `: ${requires.join(', ')}` : ''}`,
);

// Both builds in one process (an ESM app with a CommonJS module that requires the package): two
// DisLockModules that do not know each other, which the module says when the app starts; one build,
// nothing said.
const startApp = (loadBoth) => {
  const script = `
    import 'reflect-metadata';
    import { createRequire } from 'node:module';
    import { Module } from '@nestjs/common';
    import { NestFactory } from '@nestjs/core';
    import { DisLockModule } from 'nestjs-dislock';
    if (${loadBoth}) createRequire(import.meta.url)('nestjs-dislock');
    class AppModule {}
    Module({ imports: [DisLockModule.forRoot({ store: 'memory' })] })(AppModule);
    const app = await NestFactory.createApplicationContext(AppModule, { logger: ['warn', 'error'] });
    await app.close();
  `;
  const result = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: root, encoding: 'utf8' });
  return { ok: result.status === 0, output: `${result.stdout}${result.stderr}` };
};
const [both, one] = [startApp(true), startApp(false)];
check(
  both.ok && /loaded twice in this process/.test(both.output),
  `an app with both builds loaded says so when it starts${both.ok ? '' : `: ${both.output}`}`,
);
check(
  one.ok && !/loaded twice/.test(one.output),
  `an app with one build loaded says nothing${one.ok ? '' : `: ${one.output}`}`,
);

console.log(failures.length === 0 ? 'package: all checks passed' : `package: ${failures.length} check(s) failed`);
process.exit(failures.length === 0 ? 0 : 1);
