from rocforge_build.cli import main

raise SystemExit(main())
