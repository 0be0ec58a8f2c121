import { Controller, Get, HttpCode, HttpStatus, NotFoundException, Param, Post } from '@nestjs/common';
import { type ArchivedReport, ReportArchive } from './report-archive';
import { type Report, ReportService } from './report.service';

@Controller('reports')
export class ReportController {
  constructor(
    private readonly reports: ReportService,
    private readonly archive: ReportArchive,
  ) {}

  /** Runs the job and answers with its report; 409 while the same report runs anywhere. */
  @Post(':name')
  @HttpCode(HttpStatus.OK)
  generate(@Param('name') name: string): Promise<Report> {
    return this.reports.generate(name);
  }

  /** What the archive holds for the report: the last writer, its fencing token and its progress. */
  @Get(':name')
  async archived(@Param('name') name: string): Promise<ArchivedReport> {
    const record = await this.archive.read(name);
    if (!record) throw new NotFoundException(`No report "${name}" has been written yet`);
    return record;
  }
}
