#include <stdio.h>

int main(void) {
    puts("extra");
    return 0;
}
