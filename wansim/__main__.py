from wansim.cli import main

raise SystemExit(main())
