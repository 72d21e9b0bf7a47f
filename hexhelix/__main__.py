import sys

from hexhelix.cli import main

sys.exit(main())
