#include <ctype.h>
#include <stdio.h>

#ifdef FIXTURE_BREAK
#error "FIXTURE_BREAK is set: this build fails on purpose"
#endif

void greet(void) {
    const char *text = FIXTURE_GREETING;
#ifdef FIXTURE_LOUD
    for (const char *p = text; *p; p++) putchar(toupper((unsigned char)*p));
    putchar('\n');
#else
    puts(text);
#endif
#ifdef FIXTURE_ACCEL
    puts("accel: on");
#endif
    puts("fixture 1.2.0");
}
