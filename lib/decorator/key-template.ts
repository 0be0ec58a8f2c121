import { describeError } from '../errors/describe-error';
import { InvalidLockOptionsError, KeyResolutionError } from '../errors';
import { MAX_LOCK_NAME_LENGTH, type LockKey } from '../options/dislock.options';
import { describeLoneSurrogate, loneSurrogateAt } from '../options/well-formed';

/**
 * Key templates: literal text with placeholders over the method's arguments.
 *
 *   'order:{0}'              -> 'order:' + args[0]
 *   'user:{0.id}'            -> 'user:' + args[0].id
 *   'sku:{1.items.0.sku}'    -> 'sku:' + args[1].items[0].sku
 *   '{{literal}}'            -> '{literal}'
 *
 * A template is parsed once, when the decorator is applied; resolving it only walks own properties
 * and accepts strings, finite numbers, bigints and booleans as values.
 */

type Part = string | { readonly index: number; readonly path: readonly string[]; readonly source: string };

/** Turns method arguments into a lock name. Throws `KeyResolutionError`, before any I/O. */
export type KeyResolver = (args: readonly unknown[]) => string;

const PLACEHOLDER = /^(0|[1-9]\d*)((?:\.[A-Za-z_$][\w$]*|\.\d+)*)$/;
const FORBIDDEN_SEGMENTS: ReadonlySet<string> = new Set(['__proto__', 'constructor', 'prototype']);

function parse(template: string): Part[] {
  const parts: Part[] = [];
  let literal = '';
  let i = 0;
  while (i < template.length) {
    const ch = template[i];
    if ((ch === '{' || ch === '}') && template[i + 1] === ch) {
      literal += ch;
      i += 2;
      continue;
    }
    if (ch === '}') {
      throw new InvalidLockOptionsError(
        'key',
        `@DisLock: key template "${template}" has an unmatched "}" at position ${i} (write "}}" for a literal brace)`,
      );
    }
    if (ch !== '{') {
      literal += ch;
      i += 1;
      continue;
    }
    const end = template.indexOf('}', i + 1);
    const source = end === -1 ? '' : template.slice(i + 1, end);
    const match = end === -1 ? null : PLACEHOLDER.exec(source);
    if (!match) {
      throw new InvalidLockOptionsError(
        'key',
        `@DisLock: key template "${template}" has a malformed placeholder at position ${i}; ` +
          `use {N} or {N.path.to.field} with N the argument index (write "{{" for a literal brace)`,
      );
    }
    const path = match[2] ? match[2].slice(1).split('.') : [];
    const forbidden = path.find((segment) => FORBIDDEN_SEGMENTS.has(segment));
    if (forbidden !== undefined) {
      throw new InvalidLockOptionsError(
        'key',
        `@DisLock: key template "${template}" reaches through "${forbidden}", which is never allowed`,
      );
    }
    if (literal) parts.push(literal);
    literal = '';
    parts.push({ index: Number(match[1]), path, source });
    i = end + 1;
  }
  if (literal) parts.push(literal);
  return parts;
}

function stringify(template: string, source: string, value: unknown): string {
  switch (typeof value) {
    case 'string':
      if (value.length === 0) {
        throw new KeyResolutionError(template, `Lock key "${template}": {${source}} is an empty string`);
      }
      return value;
    case 'number':
      if (!Number.isFinite(value)) {
        throw new KeyResolutionError(template, `Lock key "${template}": {${source}} is ${value}`);
      }
      return String(value);
    case 'bigint':
    case 'boolean':
      return String(value);
    default:
      throw new KeyResolutionError(
        template,
        `Lock key "${template}": {${source}} resolved to ${value === null ? 'null' : typeof value}; ` +
          'a placeholder must reach a string, number, bigint or boolean',
      );
  }
}

function walk(template: string, part: Exclude<Part, string>, args: readonly unknown[]): unknown {
  if (part.index >= args.length) {
    throw new KeyResolutionError(
      template,
      `Lock key "${template}": {${part.source}} refers to argument ${part.index}, but the method got ${args.length}`,
    );
  }
  let value: unknown = args[part.index];
  for (const segment of part.path) {
    let own: boolean;
    try {
      // Only own properties: a template never reads through the prototype chain (getters, Object.prototype).
      own =
        value !== null &&
        (typeof value === 'object' || typeof value === 'string') &&
        Object.hasOwn(Object(value) as object, segment);
      if (own) value = (value as Record<string, unknown>)[segment];
    } catch (error) {
      // An own getter or a Proxy trap that throws.
      throw new KeyResolutionError(
        template,
        `Lock key "${template}": reading {${part.source}} threw: ${describeError(error)}`,
        { cause: error },
      );
    }
    if (!own) {
      throw new KeyResolutionError(
        template,
        `Lock key "${template}": {${part.source}} cannot be resolved, "${segment}" is not an own property`,
      );
    }
  }
  return value;
}

/** Validates a lock name produced by a template, a key function or passed to `LockService`. */
export function checkLockName(name: unknown, template: string): string {
  if (typeof name !== 'string' || name.length === 0) {
    throw new KeyResolutionError(template, `Lock key "${template}" must resolve to a non-empty string`);
  }
  if (name.length > MAX_LOCK_NAME_LENGTH) {
    throw new KeyResolutionError(
      template,
      `Lock key "${template}" resolved to ${name.length} characters; the limit is ${MAX_LOCK_NAME_LENGTH}`,
    );
  }
  // The whole name, not each part: a literal ending in a high surrogate and a value starting with a
  // low one make a well-formed pair.
  const lone = loneSurrogateAt(name);
  if (lone !== -1) {
    throw new KeyResolutionError(
      template,
      `Lock key "${template}" must resolve to well-formed Unicode: ${describeLoneSurrogate(name, lone)}`,
    );
  }
  return name;
}

/** Compiles a template or key function once; throws `InvalidLockOptionsError` for a malformed template. */
export function compileKey(key: LockKey): KeyResolver {
  if (typeof key === 'function') {
    const label = `<function ${key.name || 'anonymous'}>`;
    return (args) => {
      let name: unknown;
      try {
        name = (key as (...a: readonly unknown[]) => unknown)(...args);
      } catch (error) {
        throw new KeyResolutionError(label, `Lock key function threw: ${describeError(error)}`, {
          cause: error,
        });
      }
      return checkLockName(name, label);
    };
  }
  const parts = parse(key);
  if (parts.every((part) => typeof part === 'string')) {
    const fixed = checkStaticKey(key, parts.join(''));
    return () => fixed;
  }
  return (args) => {
    let name = '';
    for (const part of parts) {
      name += typeof part === 'string' ? part : stringify(key, part.source, walk(key, part, args));
    }
    return checkLockName(name, key);
  };
}

function checkStaticKey(template: string, name: string): string {
  try {
    return checkLockName(name, template);
  } catch (error) {
    throw new InvalidLockOptionsError('key', `@DisLock: ${(error as Error).message}`);
  }
}
