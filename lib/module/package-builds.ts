import { Logger } from '@nestjs/common';

/**
 * The builds of the package loaded in this process. It ships two (`import` loads the ES modules,
 * `require` the CommonJS); an application that loads both has two `DisLockModule`s, `LockService`s
 * and sets of tokens that do not know each other. Kept on `globalThis` under a registered symbol,
 * which both builds share. A build evaluated again (a test runner's module reset) is the same build.
 */
const BUILDS = Symbol.for('nestjs-dislock:builds');

type Build = 'ES module' | 'CommonJS';

interface Builds {
  readonly loaded: Set<Build>;
  warned: boolean;
}

function builds(): Builds {
  const known = Reflect.get(globalThis, BUILDS) as Builds | undefined;
  if (known) return known;
  const created: Builds = { loaded: new Set(), warned: false };
  Reflect.set(globalThis, BUILDS, created);
  return created;
}

/** Records this build as loaded (once, when it loads): CommonJS code runs with a `module` in scope. */
export function registerBuild(): void {
  builds().loaded.add(typeof module === 'object' ? 'CommonJS' : 'ES module');
}

/** Warns, once per process, when an application starts a `DisLockModule` with both builds loaded. */
export function warnOfBothBuilds(): void {
  const all = builds();
  if (all.loaded.size < 2 || all.warned) return;
  all.warned = true;
  new Logger('DisLock').warn(
    'nestjs-dislock is loaded twice in this process, its ES module build (by import) and its CommonJS build ' +
      '(by require): a LockService, @DisLock or DisLockTestingModule of one does not work with the DisLockModule ' +
      'of the other. Load the package one way only; see ' +
      'https://github.com/nestjs-dislock/nestjs-dislock/blob/main/docs/configuration.md#module-format-and-typescript',
  );
}
