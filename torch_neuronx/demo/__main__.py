import sys

from .sft import main

sys.exit(main())
