from amqpd.cli import main

raise SystemExit(main())
