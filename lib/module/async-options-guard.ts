import type { InjectionToken, OptionalFactoryDependency } from '@nestjs/common';
import { InvalidLockOptionsError } from '../errors';

type FactoryDependency = InjectionToken | OptionalFactoryDependency;

interface FactoryOptions<T> {
  useFactory?: (...args: never[]) => T | Promise<T>;
  inject?: FactoryDependency[];
}

function isOptional(dependency: FactoryDependency): dependency is OptionalFactoryDependency {
  return typeof dependency === 'object' && dependency !== null && 'token' in dependency;
}

function tokenName(token: InjectionToken): string {
  return typeof token === 'function' ? token.name : String(token);
}

/** `ConfigService` is in `ConfigModule`, `FooService` usually in `FooModule`: a hint, not a rule. */
function moduleHint(name: string): string {
  const guess = name.endsWith('Service') ? `${name.slice(0, -'Service'.length)}Module` : undefined;
  return guess ? `\`imports: [${guess}]\`` : 'the module that exports it';
}

/**
 * Wraps a `forRootAsync` factory so that an `inject` token Nest cannot resolve in DisLockModule's
 * context fails with an error about DisLockModule and its fix, instead of Nest's message about an
 * internal options token. Each required token is asked for as optional; a missing one then reaches
 * the factory as `undefined`, and the wrapper throws before the user's factory runs. Tokens the
 * application marked optional itself pass through untouched.
 */
export function guardFactoryInjection<O extends FactoryOptions<unknown>>(options: O): O {
  const { useFactory, inject } = options;
  if (!useFactory || !inject?.length) return options;
  const required = inject.map((dependency) => !isOptional(dependency));
  return {
    ...options,
    inject: inject.map((dependency) => (isOptional(dependency) ? dependency : { token: dependency, optional: true })),
    useFactory: (...args: never[]) => {
      const missing = required.findIndex((isRequired, index) => isRequired && args[index] === undefined);
      if (missing >= 0) {
        const name = tokenName(inject[missing] as InjectionToken);
        throw new InvalidLockOptionsError(
          'inject',
          `DisLockModule.forRootAsync: ${name} (inject[${missing}]) cannot be resolved for useFactory. ` +
            `DisLockModule only sees what its own \`imports\` export: add ${moduleHint(name)} to forRootAsync's ` +
            `\`imports\`, or register that module as global (e.g. \`ConfigModule.forRoot({ isGlobal: true })\`).`,
        );
      }
      return useFactory(...args);
    },
  };
}
