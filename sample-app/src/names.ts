import { type ArgumentMetadata, BadRequestException, Injectable, type PipeTransform } from '@nestjs/common';

/**
 * What the app accepts as an order id, a SKU, a report or a price list name. Each of them ends up
 * in a lock name (`sku:{0}`) and a Redis key, so they are kept short and free of separators: a
 * name the library would refuse (over 512 characters) is a 400 here rather than a 500 there.
 */
const NAME = /^[A-Za-z0-9._-]{1,64}$/;

export const NAME_RULE = '1 to 64 letters, digits, ".", "_" or "-"';

export function isName(value: unknown): value is string {
  return typeof value === 'string' && NAME.test(value);
}

/** `@Param('sku', ParseNamePipe)`: 400 unless the parameter is a name (see `NAME_RULE`). */
@Injectable()
export class ParseNamePipe implements PipeTransform<unknown, string> {
  transform(value: unknown, metadata: ArgumentMetadata): string {
    if (!isName(value)) throw new BadRequestException(`${metadata.data ?? 'name'} must be ${NAME_RULE}`);
    return value;
  }
}
