/**
 * Property-based tests of key templates over hostile arguments: whatever the template and
 * whatever the method receives (null-prototype objects, throwing or recording getters, Proxies,
 * symbols, bigints, huge strings, own `__proto__` keys, inherited properties), resolving a key
 * either yields a bounded, non-empty name or throws `KeyResolutionError`, and never reads through
 * a prototype chain.
 */
import fc from 'fast-check';
import { MAX_LOCK_NAME_LENGTH } from '../options/dislock.options';
import { InvalidLockOptionsError, KeyResolutionError } from '../errors';
import { compileKey, type KeyResolver } from './key-template';

const RUNS = { numRuns: 250 };

/** Path segments a placeholder may use; several exist on built-in prototypes. */
const SAFE_SEGMENTS = [
  'a',
  'b',
  'id',
  'items',
  '$x',
  '_y',
  'length',
  '0',
  '1',
  '2',
  '10',
  'toString',
  'valueOf',
  'hasOwnProperty',
  'then',
  'name',
  'probe',
] as const;
const FORBIDDEN_SEGMENTS = ['__proto__', 'constructor', 'prototype'] as const;
const PROBE = 'probe';
const INHERITED_VALUE = 'INHERITED';

// ---- templates --------------------------------------------------------------------------------

interface Placeholder {
  readonly index: number;
  readonly path: readonly string[];
}
type Piece = string | Placeholder;

const safeSegment = fc.constantFrom(...SAFE_SEGMENTS);
const anySegment = fc.oneof(
  { weight: 8, arbitrary: safeSegment },
  { weight: 1, arbitrary: fc.constantFrom(...FORBIDDEN_SEGMENTS) },
);

const placeholderOf = (segment: fc.Arbitrary<string>): fc.Arbitrary<Placeholder> =>
  fc.record({
    index: fc.oneof({ weight: 6, arbitrary: fc.nat(3) }, { weight: 1, arbitrary: fc.constantFrom(9, 1e20) }),
    path: fc.array(segment, { maxLength: 4 }),
  });

/**
 * Halves of surrogate pairs, alone or matched by chance, among other text: a name with a lone one
 * is refused, since UTF-8 (how Redis gets its keys) would write U+FFFD for it. fast-check's
 * `'binary'` unit never makes one, so they are made here.
 */
const surrogateText = fc.string({
  unit: fc.constantFrom('s', '\uD800', '\uDBFF', '\uDC00', '\uDFFF', '\uD83D', '\uDE00', '\uFFFD'),
  minLength: 1,
  maxLength: 4,
});
/** Text with no lone surrogate (a pair is one character, as UTF-8 reads it). */
const isWellFormedText = (text: string): boolean => !/\p{Cs}/u.test(text);

/** Literal text without braces: short unicode, lone surrogates, or long enough to overflow. */
const literalText = fc
  .oneof(
    { weight: 8, arbitrary: fc.string({ unit: 'binary', maxLength: 12 }) },
    { weight: 2, arbitrary: surrogateText },
    { weight: 1, arbitrary: fc.string({ unit: 'binary-ascii', minLength: 200, maxLength: 600 }) },
  )
  .map((text) => text.replace(/[{}]/g, ''))
  .filter((text) => text.length > 0);
const literalPiece = fc.oneof({ weight: 4, arbitrary: literalText }, fc.constant('{{'), fc.constant('}}'));

const render = (piece: Piece): string =>
  typeof piece === 'string'
    ? piece
    : `{${piece.index === 1e20 ? '100000000000000000000' : piece.index}${piece.path.map((s) => `.${s}`).join('')}}`;
const unescape = (piece: string): string => (piece === '{{' ? '{' : piece === '}}' ? '}' : piece);

const piecesArb = (segment: fc.Arbitrary<string>): fc.Arbitrary<Piece[]> =>
  fc.array(fc.oneof(literalPiece, placeholderOf(segment)), { minLength: 1, maxLength: 6 });

interface WellFormed {
  readonly template: string;
  readonly pieces: readonly Piece[];
}
const wellFormed = (segment: fc.Arbitrary<string> = anySegment): fc.Arbitrary<WellFormed> =>
  piecesArb(segment).map((pieces) => ({ template: pieces.map(render).join(''), pieces }));

/** Arbitrary strings, biased towards the template syntax so that many of them parse. */
const arbitraryTemplate = fc.oneof(
  fc.string({
    unit: fc.constantFrom('{', '}', '.', '0', '1', '9', 'a', 'id', '_', '$', ':', ' ', 'é', '\u0000', '__proto__'),
    maxLength: 24,
  }),
  fc.string({ unit: 'grapheme', maxLength: 24 }),
  fc.string({ unit: 'binary', maxLength: 24 }),
);

const placeholders = (pieces: readonly Piece[]): Placeholder[] =>
  pieces.filter((piece): piece is Placeholder => typeof piece !== 'string');
const hasForbidden = (pieces: readonly Piece[]): boolean =>
  placeholders(pieces).some((p) => p.path.some((s) => (FORBIDDEN_SEGMENTS as readonly string[]).includes(s)));

// ---- hostile arguments ------------------------------------------------------------------------

/**
 * A description of an argument, built fresh for each run (getters and Proxies record what is
 * done to them, so the values themselves must not be shared between runs).
 */
type Spec =
  | { readonly t: 'value'; readonly v: unknown }
  | { readonly t: 'object'; readonly nullProto: boolean; readonly props: readonly (readonly [string, Spec])[] }
  | { readonly t: 'array'; readonly items: readonly Spec[] }
  | { readonly t: 'getter'; readonly key: string; readonly value: Spec }
  | { readonly t: 'throwing'; readonly key: string; readonly thrown: unknown }
  | { readonly t: 'proxy'; readonly target: Spec }
  | {
      readonly t: 'inherits';
      readonly own: readonly (readonly [string, Spec])[];
      readonly inherited: readonly string[];
    }
  | { readonly t: 'protoKey'; readonly value: Spec }
  | { readonly t: 'revoked' };

const leafValue = fc.oneof(
  { weight: 6, arbitrary: fc.oneof(fc.string({ maxLength: 8 }), fc.integer(), fc.boolean(), fc.bigInt()) },
  { weight: 1, arbitrary: surrogateText },
  {
    weight: 3,
    arbitrary: fc.anything({
      withNullPrototype: true,
      withBigInt: true,
      withBoxedValues: true,
      withMap: true,
      withSet: true,
      withDate: true,
      withTypedArray: true,
      withSparseArray: true,
      withObjectString: true,
      key: fc.oneof(safeSegment, fc.constantFrom(...FORBIDDEN_SEGMENTS)),
      maxDepth: 2,
    }),
  },
  {
    weight: 2,
    arbitrary: fc.constantFrom<unknown>(
      Symbol('s'),
      Symbol.iterator,
      NaN,
      Infinity,
      -Infinity,
      -0,
      10n ** 40n,
      '',
      'x'.repeat(MAX_LOCK_NAME_LENGTH),
      'y'.repeat(MAX_LOCK_NAME_LENGTH + 1),
      'z'.repeat(1_000_000),
      () => 'fn',
      null,
      undefined,
      new Error('an error'),
      Promise.resolve('p'),
    ),
  },
);

/** What a getter throws: anything with a usable string form (see the regression test below for the rest). */
const tameThrown = fc.oneof(
  fc.anything({
    withBigInt: true,
    withBoxedValues: true,
    withDate: true,
    maxDepth: 1,
    key: fc.constantFrom('a', 'b', 'c'),
  }),
  fc.string().map((m) => new Error(m)),
  fc.constant(new TypeError('getter failed')),
);

const props = (node: fc.Arbitrary<Spec>): fc.Arbitrary<(readonly [string, Spec])[]> =>
  fc.array(fc.tuple(anySegment, node), { maxLength: 4 });

const specArb: fc.Arbitrary<Spec> = fc.letrec<{ node: Spec }>((tie) => ({
  node: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    { weight: 4, arbitrary: leafValue.map((v): Spec => ({ t: 'value', v })) },
    {
      weight: 3,
      arbitrary: fc.record({ t: fc.constant('object'), nullProto: fc.boolean(), props: props(tie('node')) }),
    },
    { weight: 2, arbitrary: fc.record({ t: fc.constant('array'), items: fc.array(tie('node'), { maxLength: 3 }) }) },
    { weight: 1, arbitrary: fc.record({ t: fc.constant('getter'), key: anySegment, value: tie('node') }) },
    { weight: 1, arbitrary: fc.record({ t: fc.constant('throwing'), key: anySegment, thrown: tameThrown }) },
    { weight: 1, arbitrary: fc.record({ t: fc.constant('proxy'), target: tie('node') }) },
    {
      weight: 2,
      arbitrary: fc.record({
        t: fc.constant('inherits'),
        own: props(tie('node')),
        inherited: fc.array(safeSegment, { minLength: 1, maxLength: 4 }),
      }),
    },
    { weight: 1, arbitrary: fc.record({ t: fc.constant('protoKey'), value: tie('node') }) },
    { weight: 1, arbitrary: fc.constant({ t: 'revoked' as const }) },
  ),
})).node;

/** What resolution did to the instrumented arguments. */
interface Probe {
  /** Any access to an instrumented prototype (trap or getter): must stay empty. */
  readonly inherited: string[];
  /** Traps other than own-property reads on an argument Proxy (writes, `has`, ...): must stay empty. */
  readonly misuse: string[];
  /** `get` traps for a key not first confirmed as own: must stay empty. */
  readonly unchecked: string[];
  /** Calls of own getters. */
  getterCalls: number;
}

const newProbe = (): Probe => ({ inherited: [], misuse: [], unchecked: [], getterCalls: 0 });

function define(target: object, key: string, value: unknown): void {
  // defineProperty, not assignment: `__proto__` becomes an own key as JSON.parse makes it.
  Object.defineProperty(target, key, { value, enumerable: true, configurable: true, writable: true });
}

/** A prototype that records every trap run on it, with an own data property per key it "provides". */
function instrumentedProto(keys: readonly string[], probe: Probe): object {
  const target: Record<string, unknown> = {};
  for (const key of keys) define(target, key, INHERITED_VALUE);
  return new Proxy(target, {
    get: (t, key, receiver) => (probe.inherited.push(`get ${String(key)}`), Reflect.get(t, key, receiver) as unknown),
    has: (t, key) => (probe.inherited.push(`has ${String(key)}`), Reflect.has(t, key)),
    getOwnPropertyDescriptor: (t, key) => (
      probe.inherited.push(`getOwnPropertyDescriptor ${String(key)}`),
      Reflect.getOwnPropertyDescriptor(t, key)
    ),
    ownKeys: (t) => (probe.inherited.push('ownKeys'), Reflect.ownKeys(t)),
    set: (t, key, value, receiver) => (
      probe.inherited.push(`set ${String(key)}`),
      Reflect.set(t, key, value, receiver)
    ),
    defineProperty: (t, key, d) => (
      probe.inherited.push(`defineProperty ${String(key)}`),
      Reflect.defineProperty(t, key, d)
    ),
    deleteProperty: (t, key) => (probe.inherited.push(`deleteProperty ${String(key)}`), Reflect.deleteProperty(t, key)),
  });
}

/** A Proxy forwarding to `target` that records what is done to it. */
function recordingProxy(target: object, probe: Probe): object {
  const confirmedOwn = new Set<PropertyKey>();
  const misuse = (trap: string) => (): never => {
    probe.misuse.push(trap);
    throw new Error(`the resolver must not use the ${trap} trap`);
  };
  return new Proxy(target, {
    getOwnPropertyDescriptor: (t, key) => {
      const descriptor = Reflect.getOwnPropertyDescriptor(t, key);
      if (descriptor) confirmedOwn.add(key);
      return descriptor;
    },
    get: (t, key, receiver) => {
      if (!confirmedOwn.has(key)) probe.unchecked.push(String(key));
      return Reflect.get(t, key, receiver) as unknown;
    },
    has: (t, key) => (probe.misuse.push(`has ${String(key)}`), Reflect.has(t, key)),
    set: misuse('set'),
    defineProperty: misuse('defineProperty'),
    deleteProperty: misuse('deleteProperty'),
    setPrototypeOf: misuse('setPrototypeOf'),
    preventExtensions: misuse('preventExtensions'),
  });
}

function build(spec: Spec, probe: Probe): unknown {
  switch (spec.t) {
    case 'value':
      return spec.v;
    case 'object': {
      const object = (spec.nullProto ? Object.create(null) : {}) as object;
      for (const [key, value] of spec.props) define(object, key, build(value, probe));
      return object;
    }
    case 'array':
      return spec.items.map((item) => build(item, probe));
    case 'getter': {
      const value = build(spec.value, probe);
      const object = {};
      Object.defineProperty(object, spec.key, {
        enumerable: true,
        get: () => {
          probe.getterCalls += 1;
          return value;
        },
      });
      return object;
    }
    case 'throwing': {
      const object = {};
      Object.defineProperty(object, spec.key, {
        enumerable: true,
        get: () => {
          probe.getterCalls += 1;
          throw spec.thrown;
        },
      });
      return object;
    }
    case 'proxy': {
      const target = build(spec.target, probe);
      return (typeof target === 'object' && target !== null) || typeof target === 'function'
        ? recordingProxy(target, probe)
        : target;
    }
    case 'inherits': {
      const object = Object.create(instrumentedProto(spec.inherited, probe)) as object;
      for (const [key, value] of spec.own) define(object, key, build(value, probe));
      return object;
    }
    case 'protoKey': {
      const object = {};
      define(object, '__proto__', build(spec.value, probe));
      return object;
    }
    case 'revoked': {
      const { proxy, revoke } = Proxy.revocable({ a: 'x' }, {});
      revoke();
      return proxy;
    }
  }
}

// ---- templates aimed at the arguments ---------------------------------------------------------

/** A segment the template syntax accepts and that is not refused at compile time. */
const usable = (key: string): boolean =>
  /^(?:[A-Za-z_$][\w$]*|\d+)$/.test(key) && !(FORBIDDEN_SEGMENTS as readonly string[]).includes(key);

/** A key that is most likely missing, to end a path off the data. */
const missing = (step: number): string => SAFE_SEGMENTS[step % SAFE_SEGMENTS.length];

const MAX_DEPTH = 8;
const STOP = -1;
/** The walk's `i`-th choice: the steps given, then made-up ones; now and then STOP (ends on a container). */
const stepAt = (steps: readonly number[], i: number): number => {
  const step = i < steps.length ? steps[i] : 31 * i + steps.length;
  return step % 13 === 12 ? STOP : step;
};
/** Now and then a key that is not there. */
const offTrack = (step: number): boolean => step % 11 === 10;

/** A path into a plain value chosen by `steps`: mostly existing own keys down to a leaf, sometimes a missing one. */
function pathIntoValue(value: unknown, steps: readonly number[], path: string[] = [], from = 0): string[] {
  for (let i = from; i < MAX_DEPTH; i += 1) {
    const step = stepAt(steps, i);
    if (step === STOP) return path;
    let keys: string[];
    if (typeof value === 'string') keys = value.length > 0 ? ['length', '0'] : ['length'];
    else if (typeof value === 'object' && value !== null) keys = Object.keys(value).filter(usable);
    else return path; // a leaf
    if (keys.length === 0 || offTrack(step)) {
      path.push(missing(step));
      return path;
    }
    const key = keys[step % keys.length];
    path.push(key);
    value = (value as Record<string, unknown>)[key];
  }
  return path;
}

/** A path into what `spec` builds, chosen by `steps`: through getters, Proxies, inherited keys, down to a leaf. */
function pathIntoSpec(start: Spec, steps: readonly number[]): string[] {
  const path: string[] = [];
  let spec = start;
  for (let i = 0; i < MAX_DEPTH; i += 1) {
    while (spec.t === 'proxy') spec = spec.target; // transparent: no segment of its own
    if (spec.t === 'value') return pathIntoValue(spec.v, steps, path, i);
    const step = stepAt(steps, i);
    if (step === STOP) return path;
    switch (spec.t) {
      case 'object':
      case 'inherits': {
        const own = spec.t === 'object' ? spec.props : spec.own;
        const keys = [...own.map(([key]) => key), ...(spec.t === 'inherits' ? spec.inherited : [])].filter(usable);
        if (keys.length === 0 || offTrack(step)) {
          path.push(missing(step));
          return path;
        }
        const key = keys[step % keys.length];
        path.push(key);
        const found = own.filter(([k]) => k === key).pop(); // the last definition wins
        if (!found) return path; // inherited only
        spec = found[1];
        break;
      }
      case 'array': {
        const index = offTrack(step) ? spec.items.length : step % spec.items.length || 0;
        path.push(String(index));
        if (index >= spec.items.length) return path;
        spec = spec.items[index];
        break;
      }
      case 'getter':
      case 'throwing':
        if (!usable(spec.key) || offTrack(step)) {
          path.push(missing(step));
          return path;
        }
        path.push(spec.key);
        if (spec.t === 'throwing') return path;
        spec = spec.value;
        break;
      case 'protoKey':
      case 'revoked':
        path.push(missing(step));
        return path;
    }
  }
  return path;
}

/** A plan for a template: per placeholder an optional literal before it, an argument choice and a walk. */
const planArb = fc.array(
  fc.tuple(fc.option(literalPiece, { nil: undefined }), fc.nat(), fc.array(fc.nat(), { maxLength: 4 })),
  { minLength: 1, maxLength: 3 },
);

function planTemplate<T>(
  args: readonly T[],
  plan: readonly (readonly [string | undefined, number, readonly number[]])[],
  pathInto: (arg: T, steps: readonly number[]) => string[],
): WellFormed {
  const pieces: Piece[] = [];
  for (const [literal, choice, steps] of plan) {
    if (literal !== undefined) pieces.push(literal);
    // Now and then an index past the arguments.
    const index = choice % 9 === 8 || args.length === 0 ? args.length : choice % args.length;
    pieces.push({ index, path: index < args.length ? pathInto(args[index], steps) : [] });
  }
  return { template: pieces.map(render).join(''), pieces };
}

/** Hostile arguments and a template whose placeholders mostly reach into them. */
const aimedAtSpecs = fc
  .tuple(fc.array(specArb, { minLength: 1, maxLength: 3 }), planArb)
  .map(([specs, plan]) => ({ specs, ...planTemplate(specs, plan, pathIntoSpec) }));

// ---- checks -----------------------------------------------------------------------------------

const PREFIX = 'dislock:';

const segmentCount = (pieces: readonly Piece[]): number =>
  placeholders(pieces).reduce((sum, p) => sum + p.path.length, 0);

/** Outcomes over a property's runs, to make sure the generators reach both sides. */
interface Tally {
  resolved: number;
  refused: number;
}

/**
 * Resolve and check the universal contract: a name of 1..MAX_LOCK_NAME_LENGTH characters or a
 * KeyResolutionError; nothing inherited touched; no getter read more often than the template has
 * path segments. Returns the name, or `undefined` when refused.
 */
function resolveChecked(
  resolve: KeyResolver,
  maxSegments: number,
  args: readonly unknown[],
  probe: Probe,
  tally?: Tally,
): string | undefined {
  let name: unknown;
  let refused = false;
  try {
    name = resolve(args);
  } catch (error) {
    // Only the library's own error, never a TypeError or whatever a getter threw.
    expect(error).toBeInstanceOf(KeyResolutionError);
    refused = true;
  }
  expect(probe.inherited).toEqual([]);
  expect(probe.misuse).toEqual([]);
  expect(probe.unchecked).toEqual([]);
  // Each path segment is read once: a getter is never read again between check and use.
  expect(probe.getterCalls).toBeLessThanOrEqual(maxSegments);
  if (refused) {
    if (tally) tally.refused += 1;
    return undefined;
  }
  expect(typeof name).toBe('string');
  const resolved = name as string;
  expect(resolved.length).toBeGreaterThan(0);
  expect(resolved.length).toBeLessThanOrEqual(MAX_LOCK_NAME_LENGTH);
  expect(isWellFormedText(resolved)).toBe(true);
  const key = PREFIX + resolved;
  expect(key.startsWith(PREFIX)).toBe(true);
  expect(key.length).toBeLessThanOrEqual(PREFIX.length + MAX_LOCK_NAME_LENGTH);
  expect(resolved).not.toContain(INHERITED_VALUE);
  if (tally) tally.resolved += 1;
  return resolved;
}

/** Compile, expecting `InvalidLockOptionsError` (option `key`) as the only possible failure. */
function compileChecked(template: string): KeyResolver | undefined {
  try {
    return compileKey(template);
  } catch (error) {
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect((error as InvalidLockOptionsError).option).toBe('key');
    return undefined;
  }
}

/** Reference resolution: own properties of objects and strings; a string, finite number, bigint or boolean at the end. */
function model(pieces: readonly Piece[], args: readonly unknown[]): string | undefined {
  let name = '';
  for (const piece of pieces) {
    if (typeof piece === 'string') {
      name += unescape(piece);
      continue;
    }
    if (piece.index >= args.length) return undefined;
    let value = args[piece.index];
    for (const segment of piece.path) {
      const walkable = (typeof value === 'object' && value !== null) || typeof value === 'string';
      if (!walkable || !Object.prototype.hasOwnProperty.call(value, segment)) return undefined;
      value = (value as Record<string, unknown>)[segment];
    }
    if (typeof value === 'string' && value.length > 0) name += value;
    else if (typeof value === 'number' && Number.isFinite(value)) name += String(value);
    else if (typeof value === 'bigint' || typeof value === 'boolean') name += String(value);
    else return undefined;
  }
  return name.length > 0 && name.length <= MAX_LOCK_NAME_LENGTH && isWellFormedText(name) ? name : undefined;
}

function ownNames(): Record<string, string[]> {
  const protos = { Object, Array, String, Number, Function, Boolean, BigInt, Symbol, Error, Promise };
  return Object.fromEntries(
    Object.entries(protos).map(([name, ctor]) => [name, Reflect.ownKeys(ctor.prototype).map(String).sort()]),
  );
}

// ---- properties -------------------------------------------------------------------------------

describe('compileKey: properties over hostile templates and arguments', () => {
  const before = ownNames();

  afterAll(() => {
    // Nothing was ever written to a built-in prototype, whatever the arguments carried.
    expect(ownNames()).toEqual(before);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('templates aimed into hostile arguments: a bounded name or KeyResolutionError, nothing inherited read', () => {
    const tally: Tally = { resolved: 0, refused: 0 };
    fc.assert(
      fc.property(aimedAtSpecs, ({ specs, template, pieces }) => {
        const resolve = compileChecked(template);
        expect(resolve).toBeDefined(); // aimed paths never use a forbidden segment
        if (!resolve) return;
        const probe = newProbe();
        const args = specs.map((spec) => build(spec, probe));
        resolveChecked(resolve, segmentCount(pieces), args, probe, tally);
      }),
      { numRuns: 500 },
    );
    // The generators reach both outcomes often (a vacuous property would pass too).
    expect(tally.resolved).toBeGreaterThan(50);
    expect(tally.refused).toBeGreaterThan(50);
  });

  it('well-formed templates: compile unless a segment is forbidden or a static key is empty/too long/has a lone surrogate; resolution is bounded or KeyResolutionError', () => {
    fc.assert(
      fc.property(wellFormed(), fc.array(specArb, { maxLength: 4 }), ({ template, pieces }, specs) => {
        const resolve = compileChecked(template);
        const isStatic = placeholders(pieces).length === 0;
        const staticName = isStatic ? (pieces as string[]).map(unescape).join('') : '';
        const expectRefused =
          hasForbidden(pieces) ||
          (isStatic &&
            (staticName.length === 0 || staticName.length > MAX_LOCK_NAME_LENGTH || !isWellFormedText(staticName)));
        expect(resolve === undefined).toBe(expectRefused);
        if (!resolve) return;
        const probe = newProbe();
        const args = specs.map((spec) => build(spec, probe));
        const name = resolveChecked(resolve, segmentCount(pieces), args, probe);
        if (isStatic) expect(name).toBe(staticName);
      }),
      RUNS,
    );
  });

  it('arbitrary strings as templates: InvalidLockOptionsError at compile, or bounded names / KeyResolutionError', () => {
    fc.assert(
      fc.property(arbitraryTemplate, fc.array(specArb, { maxLength: 4 }), (template, specs) => {
        const resolve = compileChecked(template);
        if (!resolve) return;
        const probe = newProbe();
        const args = specs.map((spec) => build(spec, probe));
        // Every path segment follows a '.', so the dots bound the segments.
        resolveChecked(resolve, template.split('.').length - 1, args, probe);
      }),
      RUNS,
    );
  });

  it('a placeholder reaching through __proto__, constructor or prototype is refused at compile time', () => {
    const withForbidden = fc
      .tuple(
        piecesArb(safeSegment),
        fc.nat(),
        fc.nat(3),
        fc.array(safeSegment, { maxLength: 2 }),
        fc.constantFrom(...FORBIDDEN_SEGMENTS),
        fc.array(safeSegment, { maxLength: 2 }),
      )
      .map(([pieces, at, index, head, forbidden, tail]) => {
        const all: Piece[] = [...pieces];
        all.splice(at % (pieces.length + 1), 0, { index, path: [...head, forbidden, ...tail] });
        return all.map(render).join('');
      });
    fc.assert(
      fc.property(withForbidden, (template) => {
        let error: unknown;
        try {
          compileKey(template);
        } catch (e) {
          error = e;
        }
        expect(error).toBeInstanceOf(InvalidLockOptionsError);
        expect((error as InvalidLockOptionsError).option).toBe('key');
      }),
      RUNS,
    );
  });

  it('literal text with {{ and }} resolves to the text with braces unescaped, whatever the arguments', () => {
    fc.assert(
      fc.property(
        fc.array(literalPiece, { minLength: 1, maxLength: 8 }),
        fc.array(specArb, { maxLength: 2 }),
        (pieces, specs) => {
          const template = pieces.join('');
          const expected = pieces.map(unescape).join('');
          const resolve = compileChecked(template);
          expect(resolve === undefined).toBe(expected.length > MAX_LOCK_NAME_LENGTH || !isWellFormedText(expected));
          if (!resolve) return;
          const probe = newProbe();
          expect(resolve(specs.map((spec) => build(spec, probe)))).toBe(expected);
          expect(probe).toEqual(newProbe()); // a static key touches no argument at all
        },
      ),
      RUNS,
    );
  });

  it('plain data: the name is exactly what an own-property walk gives (model check)', () => {
    const leaf = fc.oneof(
      { weight: 6, arbitrary: fc.oneof(fc.string({ maxLength: 6 }), fc.integer(), fc.boolean(), fc.bigInt()) },
      { weight: 1, arbitrary: surrogateText },
      { weight: 2, arbitrary: fc.double() },
      { weight: 2, arbitrary: fc.constantFrom<unknown>(NaN, Infinity, -Infinity, -0, '', null, undefined, 0n) },
      { weight: 1, arbitrary: fc.string({ unit: 'binary-ascii', minLength: 250, maxLength: 520 }) },
    );
    const data = fc.letrec<{ node: unknown }>((tie) => ({
      node: fc.oneof(
        { depthSize: 'small' },
        { weight: 3, arbitrary: leaf },
        fc.dictionary(fc.oneof(safeSegment, fc.constantFrom('__proto__')), tie('node'), { maxKeys: 4 }),
        fc.array(tie('node'), { maxLength: 3 }),
      ),
    })).node;
    const aimedAtData = fc
      .tuple(fc.array(data, { minLength: 1, maxLength: 3 }), planArb)
      .map(([args, plan]) => ({ args, ...planTemplate(args, plan, pathIntoValue) }));
    const tally: Tally = { resolved: 0, refused: 0 };
    fc.assert(
      fc.property(
        fc.oneof(
          aimedAtData,
          fc
            .record({ args: fc.array(data, { maxLength: 3 }) })
            .chain(({ args }) => wellFormed(safeSegment).map((t) => ({ args, ...t }))),
        ),
        ({ args, template, pieces }) => {
          const resolve = compileChecked(template);
          if (!resolve) return; // a static key that is empty, too long or not well-formed: covered above
          const expected = model(pieces, args);
          let actual: string | undefined;
          try {
            actual = resolve(args);
          } catch (error) {
            expect(error).toBeInstanceOf(KeyResolutionError);
          }
          expect(actual).toBe(expected);
          tally[actual === undefined ? 'refused' : 'resolved'] += 1;
        },
      ),
      { numRuns: 1_000 },
    );
    expect(tally.resolved).toBeGreaterThan(100);
    expect(tally.refused).toBeGreaterThan(100);
  });

  it('the length limit is exact: MAX_LOCK_NAME_LENGTH characters pass, one more is refused', () => {
    const near = fc.integer({ min: MAX_LOCK_NAME_LENGTH - 8, max: MAX_LOCK_NAME_LENGTH + 8 });
    fc.assert(
      fc.property(near, fc.nat(), fc.boolean(), (total, split, isStatic) => {
        if (isStatic) {
          const text = 'k'.repeat(total);
          expect(compileChecked(text) !== undefined).toBe(total <= MAX_LOCK_NAME_LENGTH);
          return;
        }
        const literal = split % total; // the rest (at least 1 character) comes from the argument
        const resolve = compileChecked(`${'k'.repeat(literal)}{0}`) as KeyResolver;
        const probe = newProbe();
        const name = resolveChecked(resolve, 0, ['v'.repeat(total - literal)], probe);
        expect(name?.length).toBe(total <= MAX_LOCK_NAME_LENGTH ? total : undefined);
      }),
      RUNS,
    );
  });

  it('never reads a property through a built-in prototype (getters planted on them are never called)', () => {
    const hits: string[] = [];
    const protos: object[] = [
      Object.prototype,
      Array.prototype,
      String.prototype,
      Number.prototype,
      Boolean.prototype,
      BigInt.prototype,
      Symbol.prototype,
      Function.prototype,
    ];
    for (const proto of protos) {
      Object.defineProperty(proto, PROBE, {
        configurable: true,
        get() {
          hits.push(PROBE);
          return INHERITED_VALUE;
        },
        // A write still makes an own property, as it would without the getter (fast-check builds
        // records by assignment in this same realm).
        set(this: object, value: unknown) {
          Object.defineProperty(this, PROBE, { value, writable: true, enumerable: true, configurable: true });
        },
      });
    }
    try {
      fc.assert(
        fc.property(aimedAtSpecs, wellFormed(safeSegment), ({ specs, template, pieces }, other) => {
          for (const { template: t, pieces: p } of [{ template, pieces }, other]) {
            const resolve = compileChecked(t);
            if (!resolve) continue;
            const probe = newProbe();
            const args = specs.map((spec) => build(spec, probe));
            resolveChecked(resolve, segmentCount(p), args, probe);
            expect(hits).toEqual([]);
          }
        }),
        RUNS,
      );
      // The probe works: it is what an inherited read would have hit.
      expect(([] as unknown as Record<string, unknown>)[PROBE]).toBe(INHERITED_VALUE);
      expect(hits).toEqual([PROBE]);
    } finally {
      for (const proto of protos) delete (proto as Record<string, unknown>)[PROBE];
    }
  });

  // Guards a fixed bug (lib/decorator/key-template.ts used `error instanceof Error ? error.message :
  // String(error)`, now describeError): when an own getter or Proxy trap on the path throws a value that has no string form (a
  // null-prototype object, an object whose toString throws, an Error whose `message` getter
  // throws, a Proxy whose getPrototypeOf trap throws), building the KeyResolutionError's message
  // throws in turn, and that TypeError (or the value thrown by toString) escapes the resolver
  // instead of a KeyResolutionError.
  it('whatever an own getter throws, the resolver throws KeyResolutionError with it as cause', () => {
    const nasty = fc.oneof(
      fc.anything({ withNullPrototype: true, withBigInt: true, withBoxedValues: true, maxDepth: 2 }),
      fc.constantFrom<() => unknown>(
        () => Object.create(null) as unknown,
        () => [Object.create(null) as unknown],
        () => ({
          toString() {
            throw new Error('no string form');
          },
        }),
        () =>
          Object.defineProperty(new Error('x'), 'message', {
            get() {
              throw new Error('no message');
            },
          }),
        () =>
          new Proxy(
            {},
            {
              getPrototypeOf() {
                throw new Error('no prototype');
              },
            },
          ),
      ),
    );
    fc.assert(
      fc.property(nasty, (make) => {
        const thrown = typeof make === 'function' ? (make as () => unknown)() : make;
        const arg = {};
        Object.defineProperty(arg, 'id', {
          get() {
            throw thrown;
          },
        });
        let error: unknown;
        try {
          compileKey('user:{0.id}')([arg]);
        } catch (e) {
          error = e;
        }
        expect(error).toBeInstanceOf(KeyResolutionError);
        expect((error as KeyResolutionError).cause).toBe(thrown);
      }),
      RUNS,
    );
  });
});
