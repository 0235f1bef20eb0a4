from kvbench.report.cli import main

main()
