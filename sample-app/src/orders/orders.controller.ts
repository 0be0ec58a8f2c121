import { Controller, HttpCode, HttpStatus, Param, Post } from '@nestjs/common';
import { ParseNamePipe } from '../names';
import { type Payment, OrdersService } from './orders.service';

@Controller('orders')
export class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  /** 200 with who paid; 409 while the same order is being paid (by this instance or another one). */
  @Post(':id/pay')
  @HttpCode(HttpStatus.OK)
  pay(@Param('id', ParseNamePipe) id: string): Promise<Payment> {
    return this.orders.pay(id);
  }
}
