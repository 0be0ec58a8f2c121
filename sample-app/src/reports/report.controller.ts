import { Controller, HttpCode, HttpStatus, Param, Post } from '@nestjs/common';
import { type Report, ReportService } from './report.service';

@Controller('reports')
export class ReportController {
  constructor(private readonly reports: ReportService) {}

  /** Runs the job and answers with its report; 409 while the same report runs anywhere. */
  @Post(':name')
  @HttpCode(HttpStatus.OK)
  generate(@Param('name') name: string): Promise<Report> {
    return this.reports.generate(name);
  }
}
