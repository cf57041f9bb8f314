"""``python -m impls.native``: build the native launcher now, in the foreground, and say its state."""
from impls.native import main

raise SystemExit(main())
