from moeopt.cli import main

raise SystemExit(main())
