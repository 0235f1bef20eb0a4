from kvbench.report.report_cli import main

main()
