import { BadRequestException } from '@nestjs/common';
import { isName, NAME_RULE } from '../names';

/** The body of `POST /inventory/transfer`: `{ "from": "widget", "to": "gadget", "units": 3 }`. */
export interface TransferRequest {
  readonly from: string;
  readonly to: string;
  readonly units: number;
}

/** Checks the whole body and answers 400 with every problem at once (as Nest's `ValidationPipe` does). */
export function parseTransfer(body: unknown): TransferRequest {
  const { from, to, units } = (typeof body === 'object' && body !== null ? body : {}) as Record<string, unknown>;
  const problems: string[] = [];
  if (!isName(from)) problems.push(`from must be a SKU: ${NAME_RULE}`);
  if (!isName(to)) problems.push(`to must be a SKU: ${NAME_RULE}`);
  if (isName(from) && from === to) problems.push('from and to must be different SKUs');
  if (typeof units !== 'number' || !Number.isSafeInteger(units) || units < 1) {
    problems.push('units must be a whole number >= 1');
  }
  if (problems.length > 0) throw new BadRequestException(problems);
  return { from, to, units } as TransferRequest;
}
