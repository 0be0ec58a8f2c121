import { Controller, Get, HttpCode, HttpStatus, NotFoundException, Param, Post } from '@nestjs/common';
import { ParseNamePipe } from '../names';
import { type ArchivedReport, ReportArchive } from './report-archive';
import { type ReportExport, ReportExportService } from './report-export.service';
import { type Report, ReportService } from './report.service';

@Controller('reports')
export class ReportController {
  constructor(
    private readonly reports: ReportService,
    private readonly archive: ReportArchive,
    private readonly exports: ReportExportService,
  ) {}

  /** Runs the job and answers with its report; 409 while the same report runs anywhere. */
  @Post(':name')
  @HttpCode(HttpStatus.OK)
  generate(@Param('name', ParseNamePipe) name: string): Promise<Report> {
    return this.reports.generate(name);
  }

  /** What the archive holds for the report: the last writer, its fencing token and its progress. */
  @Get(':name')
  async archived(@Param('name', ParseNamePipe) name: string): Promise<ArchivedReport> {
    const record = await this.archive.read(name);
    if (!record) throw new NotFoundException(`No report "${name}" has been written yet`);
    return record;
  }

  /** Exports the report; 409 while two exports (of any report) run, on any instance. */
  @Post(':name/export')
  @HttpCode(HttpStatus.OK)
  export(@Param('name', ParseNamePipe) name: string): Promise<ReportExport> {
    return this.exports.export(name);
  }
}
