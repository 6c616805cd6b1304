#include <cstdio>
int main() { std::puts("ptcfs"); return 0; }
