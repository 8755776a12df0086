from kiln.cli.main import main

raise SystemExit(main())
