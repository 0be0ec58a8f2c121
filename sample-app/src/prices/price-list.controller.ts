import { BadRequestException, Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Put } from '@nestjs/common';
import { isName, NAME_RULE, ParseNamePipe } from '../names';
import { type PriceList, PriceListService } from './price-list.service';

/** At most this many prices in one list. */
const MAX_PRICES = 100;

@Controller('prices')
export class PriceListController {
  constructor(private readonly prices: PriceListService) {}

  /** The list as of one revision (reads run at once, across instances); 404 when it was never set. */
  @Get(':list')
  read(@Param('list', ParseNamePipe) list: string): Promise<PriceList> {
    return this.prices.read(list);
  }

  /** Body `{ "prices": { "bolt": 120, "nut": 35 } }` (cents): replaces the whole list. */
  @Put(':list')
  replace(@Param('list', ParseNamePipe) list: string, @Body('prices') prices: unknown): Promise<PriceList> {
    return this.prices.replace(list, parsePrices(prices));
  }

  /** Body `{ "percent": 10 }` (or `-5`): every price of the list changed by that much, all at once for readers. */
  @Post(':list/reprice')
  @HttpCode(HttpStatus.OK)
  reprice(@Param('list', ParseNamePipe) list: string, @Body('percent') percent: unknown): Promise<PriceList> {
    if (typeof percent !== 'number' || !Number.isFinite(percent) || percent <= -100 || percent > 1_000) {
      throw new BadRequestException('percent must be a number above -100 and at most 1000');
    }
    return this.prices.reprice(list, percent);
  }
}

function parsePrices(prices: unknown): Record<string, number> {
  if (typeof prices !== 'object' || prices === null || Array.isArray(prices)) {
    throw new BadRequestException('prices must be an object of prices in cents by SKU');
  }
  const entries = Object.entries(prices);
  if (entries.length === 0 || entries.length > MAX_PRICES) {
    throw new BadRequestException(`prices must have 1 to ${MAX_PRICES} SKUs`);
  }
  const problems: string[] = [];
  for (const [sku, cents] of entries) {
    if (!isName(sku)) problems.push(`${JSON.stringify(entryName(sku))} is not a SKU: ${NAME_RULE}`);
    else if (typeof cents !== 'number' || !Number.isSafeInteger(cents) || cents < 0) {
      problems.push(`prices.${sku} must be a whole number of cents >= 0`);
    }
  }
  if (problems.length > 0) throw new BadRequestException(problems);
  return Object.fromEntries(entries);
}

/** A key of the body as it may be quoted in an answer: at most 70 characters of it. */
function entryName(key: string): string {
  return key.length > 70 ? `${key.slice(0, 67)}...` : key;
}
