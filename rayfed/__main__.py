import sys

from rayfed.cli import main

sys.exit(main())
