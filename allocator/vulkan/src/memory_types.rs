//! Memory types and heaps as plain data, and the choice of a memory type for a use.
