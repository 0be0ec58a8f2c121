import { MAX_LOCK_NAME_LENGTH, type LockKey } from '../options/dislock.options';
import { DisLockError, InvalidLockOptionsError, KeyResolutionError } from '../errors';
import { checkLockName, compileKey } from './key-template';

/** Compile `key` and resolve it over `args`. */
function resolve(key: LockKey, ...args: unknown[]): string {
  return compileKey(key)(args);
}

/** The error `fn` throws, for exact assertions on its class and fields. */
function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  throw new Error('expected a throw, got none');
}

function keyError(fn: () => unknown): KeyResolutionError {
  const error = thrown(fn);
  expect(error).toBeInstanceOf(KeyResolutionError);
  expect(error).toBeInstanceOf(DisLockError);
  return error as KeyResolutionError;
}

function optionsError(fn: () => unknown): InvalidLockOptionsError {
  const error = thrown(fn);
  expect(error).toBeInstanceOf(InvalidLockOptionsError);
  expect(error).toBeInstanceOf(DisLockError);
  expect((error as InvalidLockOptionsError).option).toBe('key');
  return error as InvalidLockOptionsError;
}

/** A key function whose result is not typed as a string, as JavaScript callers may pass. */
function untypedKey(fn: (...args: never[]) => unknown): LockKey {
  return fn as unknown as LockKey;
}

describe('compileKey: templates', () => {
  it('substitutes argument indexes', () => {
    expect(resolve('order:{0}', 42)).toBe('order:42');
    expect(resolve('order:{0}', 'abc')).toBe('order:abc');
    expect(resolve('{1}-{0}', 'a', 'b')).toBe('b-a');
    expect(resolve('{0}{0}', 7)).toBe('77');
    expect(resolve('{10}', ...Array.from({ length: 11 }, (_, i) => i))).toBe('10');
  });

  it('walks nested own properties, array indexes included', () => {
    expect(resolve('user:{0.id}', { id: 7 })).toBe('user:7');
    expect(resolve('sku:{1.items.0.sku}', null, { items: [{ sku: 'A-1' }, { sku: 'B-2' }] })).toBe('sku:A-1');
    expect(resolve('{0.items.1.sku}', { items: [{ sku: 'A-1' }, { sku: 'B-2' }] })).toBe('B-2');
    expect(resolve('{0.$id}:{0._x}', { $id: 'd', _x: 'u' })).toBe('d:u');
    expect(resolve('{0.a.b.c}', { a: { b: { c: 'deep' } } })).toBe('deep');
  });

  it('reads own properties of strings and arrays (length, index)', () => {
    expect(resolve('{0.length}', 'abcd')).toBe('4');
    expect(resolve('{0.1}', 'xyz')).toBe('y');
    expect(resolve('{0.length}', [1, 2, 3])).toBe('3');
  });

  it('reads own properties of null-prototype objects and own getters', () => {
    const bare = Object.create(null) as Record<string, unknown>;
    bare.id = 'np';
    expect(resolve('{0.id}', bare)).toBe('np');
    const withGetter = {};
    Object.defineProperty(withGetter, 'id', { get: () => 'own-getter', enumerable: false });
    expect(resolve('{0.id}', withGetter)).toBe('own-getter');
  });

  it('renders numbers, bigints and booleans with String()', () => {
    expect(resolve('n:{0}', 0)).toBe('n:0');
    expect(resolve('n:{0}', -5)).toBe('n:-5');
    expect(resolve('n:{0}', 1.5)).toBe('n:1.5');
    expect(resolve('n:{0}', 1e21)).toBe('n:1e+21');
    expect(resolve('n:{0}', 12345678901234567890n)).toBe('n:12345678901234567890');
    expect(resolve('b:{0}:{1}', true, false)).toBe('b:true:false');
  });

  it('keeps strings as they are, braces and unicode included', () => {
    expect(resolve('s:{0}', '{1}')).toBe('s:{1}');
    expect(resolve('s:{0}', ' spaced ')).toBe('s: spaced ');
    expect(resolve('s:{0}', 'zürich✓')).toBe('s:zürich✓');
  });

  it('compiles a static key to a constant, whatever the arguments', () => {
    const resolver = compileKey('nightly-report');
    expect(resolver([])).toBe('nightly-report');
    expect(resolver([undefined, null, {}])).toBe('nightly-report');
  });

  it('unescapes {{ and }} to literal braces', () => {
    expect(resolve('{{literal}}')).toBe('{literal}');
    expect(resolve('{{0}}', 'ignored')).toBe('{0}');
    expect(resolve('{{{0}}}', 'x')).toBe('{x}');
    expect(resolve('a}}b{{c')).toBe('a}b{c');
    expect(resolve('{0}}}', 'x')).toBe('x}');
    expect(resolve('{{{{')).toBe('{{');
  });

  it('parses once: the resolver is reusable with different arguments', () => {
    const resolver = compileKey('order:{0.id}');
    expect(resolver([{ id: 1 }])).toBe('order:1');
    expect(resolver([{ id: 2 }])).toBe('order:2');
  });

  it('accepts a resolved name of exactly MAX_LOCK_NAME_LENGTH characters', () => {
    const value = 'x'.repeat(MAX_LOCK_NAME_LENGTH - 2);
    expect(resolve('k:{0}', value)).toHaveLength(MAX_LOCK_NAME_LENGTH);
  });
});

describe('compileKey: values a placeholder may not reach', () => {
  const cases: [string, unknown, RegExp][] = [
    ['undefined', undefined, /undefined/],
    ['null', null, /null/],
    ['an object', { id: 1 }, /object/],
    ['an array', [1], /object/],
    ['a function', () => 'x', /function/],
    ['a symbol', Symbol('s'), /symbol/],
    ['an empty string', '', /empty string/],
    ['NaN', NaN, /NaN/],
    ['Infinity', Infinity, /Infinity/],
    ['-Infinity', -Infinity, /-Infinity/],
  ];

  it.each(cases)('rejects %s with KeyResolutionError naming the template and placeholder', (_label, value, detail) => {
    const error = keyError(() => resolve('order:{0}', value));
    expect(error.template).toBe('order:{0}');
    expect(error.message).toContain('order:{0}');
    expect(error.message).toContain('{0}');
    expect(error.message).toMatch(detail);
  });

  it('rejects the same values at the end of a path', () => {
    expect(keyError(() => resolve('{0.id}', { id: undefined })).message).toContain('{0.id}');
    keyError(() => resolve('{0.id}', { id: null }));
    keyError(() => resolve('{0.id}', { id: { nested: true } }));
    keyError(() => resolve('{0.id}', { id: '' }));
    keyError(() => resolve('{0.id}', { id: NaN }));
  });

  it('rejects an index beyond the arguments, even when the array has holes', () => {
    const error = keyError(() => resolve('{2}', 'a', 'b'));
    expect(error.message).toMatch(/argument 2.*got 2/);
    keyError(() => resolve('{0}'));
    // an explicit undefined argument counts, and is rejected as a value
    expect(keyError(() => resolve('{1}', 'a', undefined)).message).toMatch(/undefined/);
  });

  it('rejects a missing nested property', () => {
    const missing = keyError(() => resolve('{0.user.id}', { user: {} }));
    expect(missing.message).toContain('"id"');
    keyError(() => resolve('{0.user.id}', {}));
    keyError(() => resolve('{0.items.5.sku}', { items: [{ sku: 'a' }] }));
    keyError(() => resolve('{0.user.id}', { user: null }));
    keyError(() => resolve('{0.user.id}', { user: undefined }));
    keyError(() => resolve('{0.id}', 5)); // numbers have no own properties
    keyError(() => resolve('{0.id}', true));
    keyError(() => resolve('{0.name}', function named() {})); // functions are not walked
    keyError(() => resolve('{0.9}', 'short'));
  });

  it('never reads through the prototype chain', () => {
    class User {
      constructor(private readonly secret: string) {}
      get id(): string {
        return this.secret;
      }
    }
    const user = new User('s3cr3t');
    expect(user.id).toBe('s3cr3t');
    expect(keyError(() => resolve('{0.id}', user)).message).toContain('"id" is not an own property');
    keyError(() => resolve('{0.toString}', { a: 1 }));
    keyError(() => resolve('{0.hasOwnProperty}', {}));
    keyError(() => resolve('{0.length}', Object.create({ length: 3 }) as object));
    keyError(() => resolve('{0.at}', 'abc'));
    keyError(() => resolve('{0.map}', []));
  });

  it('turns an error thrown by an own getter on the path into KeyResolutionError (cause kept)', () => {
    // Like a throwing key function: the resolver promises KeyResolutionError and nothing else.
    const boom = new Error('getter failed');
    const subject = {};
    Object.defineProperty(subject, 'id', {
      enumerable: true,
      get(): never {
        throw boom;
      },
    });
    const error = keyError(() => resolve('user:{0.id}', subject));
    expect(error.cause).toBe(boom);
    expect(error.template).toBe('user:{0.id}');
  });

  it('rejects a resolved name longer than MAX_LOCK_NAME_LENGTH', () => {
    const value = 'x'.repeat(MAX_LOCK_NAME_LENGTH - 1);
    const error = keyError(() => resolve('k:{0}', value));
    expect(error.message).toContain(String(MAX_LOCK_NAME_LENGTH));
    expect(error.message).toContain(String(MAX_LOCK_NAME_LENGTH + 1));
  });
});

describe('compileKey: key functions', () => {
  it('calls the function with the arguments and checks the result', () => {
    const resolver = compileKey((tenant: string, job: { id: number }) => `job:${tenant}:${job.id}`);
    expect(resolver(['acme', { id: 3 }])).toBe('job:acme:3');
    expect(resolver(['other', { id: 4 }])).toBe('job:other:4');
  });

  it('gets the arguments as they are, and no `this`', () => {
    const seen: unknown[] = [];
    const resolver = compileKey(
      untypedKey(function (this: unknown, ...args: never[]) {
        seen.push(this, ...args);
        return 'k';
      }),
    );
    const arg = { a: 1 };
    expect(resolver([arg, 2])).toBe('k');
    expect(seen).toEqual([undefined, arg, 2]);
    expect(seen[1]).toBe(arg);
  });

  it('wraps an error thrown by the function, keeping it as cause', () => {
    const boom = new Error('no tenant');
    function tenantKey(): string {
      throw boom;
    }
    const error = keyError(() => resolve(tenantKey));
    expect(error.cause).toBe(boom);
    expect(error.message).toContain('no tenant');
    expect(error.template).toBe('<function tenantKey>');
  });

  it('wraps a thrown non-Error value too', () => {
    const fromString = keyError(() =>
      resolve(
        untypedKey(() => {
          throw 'plain string'; // eslint-disable-line @typescript-eslint/only-throw-error
        }),
      ),
    );
    expect(fromString.cause).toBe('plain string');
    expect(fromString.message).toContain('plain string');
    const fromNull = keyError(() =>
      resolve(
        untypedKey(() => {
          throw null; // eslint-disable-line @typescript-eslint/only-throw-error
        }),
      ),
    );
    expect(fromNull.cause).toBeNull();
  });

  it.each<[string, unknown]>([
    ['undefined', undefined],
    ['null', null],
    ['a number', 42],
    ['an object', { toString: () => 'x' }],
    ['an empty string', ''],
  ])('rejects a function returning %s', (_label, value) => {
    const error = keyError(() => resolve(untypedKey(() => value)));
    expect(error.template).toMatch(/^<function /);
  });

  it('labels anonymous functions', () => {
    const error = keyError(() => compileKey(untypedKey(() => undefined))([]));
    expect(error.template).toBe('<function anonymous>');
  });

  it('rejects a function result longer than MAX_LOCK_NAME_LENGTH, accepts exactly the limit', () => {
    expect(resolve(() => 'y'.repeat(MAX_LOCK_NAME_LENGTH))).toHaveLength(MAX_LOCK_NAME_LENGTH);
    keyError(() => resolve(() => 'y'.repeat(MAX_LOCK_NAME_LENGTH + 1)));
  });

  it('does not call the function at compile time', () => {
    const fn = vi.fn(() => 'k');
    const resolver = compileKey(fn);
    expect(fn).not.toHaveBeenCalled();
    resolver([]);
    expect(fn).toHaveBeenCalledTimes(1);
  });
});

describe('compileKey: malformed templates fail at compile time', () => {
  it.each([
    '',
    '{',
    '}',
    '{}',
    '{a}',
    '{0.}',
    '{0..x}',
    '{-1}',
    '{01}',
    '{ 0 }',
    '{0 }',
    '{0.a-b}',
    '{0[1]}',
    '{0.1x}',
    'order:{0',
    'order:0}',
    '{{0}',
    '{0}}',
    '{0}{',
    '{1.5e3}',
  ])('rejects %j with InvalidLockOptionsError (option "key")', (template) => {
    const error = optionsError(() => compileKey(template));
    expect(error.message).toContain(`"${template}"`);
  });

  it.each(['{0.constructor}', '{0.prototype}', '{0.__proto__}', '{1.a.__proto__.b}', '{0.constructor.name}'])(
    'rejects %j, which reaches a forbidden property',
    (template) => {
      const error = optionsError(() => compileKey(template));
      expect(error.message).toMatch(/__proto__|constructor|prototype/);
      expect(error.message).toContain('never allowed');
    },
  );

  it('rejects a static key longer than MAX_LOCK_NAME_LENGTH at compile time', () => {
    const error = optionsError(() => compileKey('s'.repeat(MAX_LOCK_NAME_LENGTH + 1)));
    expect(error.message).toContain(String(MAX_LOCK_NAME_LENGTH));
    expect(compileKey('s'.repeat(MAX_LOCK_NAME_LENGTH))([])).toHaveLength(MAX_LOCK_NAME_LENGTH);
  });

  it('counts the length of a static key after unescaping', () => {
    // 2 * MAX escaped braces unescape to MAX characters: allowed.
    expect(compileKey('{{'.repeat(MAX_LOCK_NAME_LENGTH))([])).toBe('{'.repeat(MAX_LOCK_NAME_LENGTH));
  });

  it('names the position of the fault', () => {
    expect(optionsError(() => compileKey('ab}')).message).toContain('position 2');
    expect(optionsError(() => compileKey('abc{x}')).message).toContain('position 3');
  });
});

describe('checkLockName', () => {
  it('returns a valid name as it is', () => {
    expect(checkLockName('order:1', 't')).toBe('order:1');
    expect(checkLockName('x'.repeat(MAX_LOCK_NAME_LENGTH), 't')).toHaveLength(MAX_LOCK_NAME_LENGTH);
  });

  it.each<[string, unknown]>([
    ['an empty string', ''],
    ['undefined', undefined],
    ['null', null],
    ['a number', 1],
    ['a String object', new String('x')],
    ['a too long string', 'x'.repeat(MAX_LOCK_NAME_LENGTH + 1)],
  ])('rejects %s with KeyResolutionError carrying the template', (_label, name) => {
    const error = keyError(() => checkLockName(name, 'my-template'));
    expect(error.template).toBe('my-template');
    expect(error.message).toContain('my-template');
  });
});

describe('names that are not well-formed Unicode (a lone surrogate, which UTF-8 writes as U+FFFD)', () => {
  it.each<[string, string]>([
    ['a high half at the end', 's\uD800'],
    ['another high half at the end', 's\uDBFF'],
    ['a low half first', '\uDC00s'],
    ['two halves in the wrong order', 's\uDE00\uD83D'],
  ])('refuses %s from a placeholder, a key function and a static key, naming where', (_label, name) => {
    const fromPlaceholder = keyError(() => resolve('job:{0}', name));
    expect(fromPlaceholder.message).toContain('must resolve to well-formed Unicode');
    expect(fromPlaceholder.message).toMatch(/lone surrogate \(\\u[0-9A-F]{4}\) at position \d+/);
    keyError(() => resolve(() => name));
    expect(optionsError(() => compileKey(name)).message).toContain('well-formed Unicode');
  });

  it("keeps names that differ from them: U+FFFD itself and a pair made of a literal's half and a value's", () => {
    expect(resolve('s\uFFFD')).toBe('s\uFFFD');
    expect(resolve('s\uD83D{0}', '\uDE00')).toBe('s\uD83D\uDE00');
    expect(resolve(() => 'emoji:\uD83D\uDE00')).toBe('emoji:\uD83D\uDE00');
  });
});
