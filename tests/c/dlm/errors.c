/* Uses of a dlm array that would change meaning after translation: rmem cc must refuse
 * them, naming this file and line. */
dlm int a[4];

void f(int *p)
{
    a = p;
}
