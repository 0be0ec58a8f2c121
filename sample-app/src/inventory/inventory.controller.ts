import { BadRequestException, Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Put } from '@nestjs/common';
import { ParseNamePipe } from '../names';
import { InventoryService, type Reservation, type StockLevel, type Transfer } from './inventory.service';
import { parseTransfer } from './transfer.request';

@Controller('inventory')
export class InventoryController {
  constructor(private readonly inventory: InventoryService) {}

  @Get(':sku')
  stock(@Param('sku', ParseNamePipe) sku: string): Promise<StockLevel> {
    return this.inventory.stock(sku);
  }

  /** Body `{ "stock": 10 }`. */
  @Put(':sku')
  restock(@Param('sku', ParseNamePipe) sku: string, @Body('stock') stock: unknown): Promise<StockLevel> {
    if (typeof stock !== 'number' || !Number.isSafeInteger(stock) || stock < 0) {
      throw new BadRequestException('stock must be a whole number >= 0');
    }
    return this.inventory.restock(sku, stock);
  }

  /** 200 with the units left; 409 when out of stock. */
  @Post(':sku/reserve')
  @HttpCode(HttpStatus.OK)
  reserve(@Param('sku', ParseNamePipe) sku: string): Promise<Reservation> {
    return this.inventory.reserve(sku);
  }

  /**
   * Body `{ "from": "widget", "to": "gadget", "units": 3 }`. 200 with both stock levels after the
   * move; 400 for a bad body (every problem listed); 409 when `from` has fewer than `units`.
   */
  @Post('transfer')
  @HttpCode(HttpStatus.OK)
  transfer(@Body() body: unknown): Promise<Transfer> {
    const { from, to, units } = parseTransfer(body);
    return this.inventory.transfer(from, to, units);
  }
}
