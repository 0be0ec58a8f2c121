import { BadRequestException, Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Put } from '@nestjs/common';
import { InventoryService, type Reservation, type StockLevel } from './inventory.service';

@Controller('inventory')
export class InventoryController {
  constructor(private readonly inventory: InventoryService) {}

  @Get(':sku')
  stock(@Param('sku') sku: string): Promise<StockLevel> {
    return this.inventory.stock(sku);
  }

  /** Body `{ "stock": 10 }`. */
  @Put(':sku')
  restock(@Param('sku') sku: string, @Body('stock') stock: unknown): Promise<StockLevel> {
    if (typeof stock !== 'number' || !Number.isSafeInteger(stock) || stock < 0) {
      throw new BadRequestException('stock must be a whole number >= 0');
    }
    return this.inventory.restock(sku, stock);
  }

  /** 200 with the units left; 409 when out of stock. */
  @Post(':sku/reserve')
  @HttpCode(HttpStatus.OK)
  reserve(@Param('sku') sku: string): Promise<Reservation> {
    return this.inventory.reserve(sku);
  }
}
